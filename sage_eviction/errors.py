"""Exceptions raised by the policy library.

The tree::

    SageEvictionError
    ├── PolicyConfigError (also ValueError)
    │   ├── UnknownPolicyError       an unknown policy name; lists the names that exist
    │   ├── OfflinePolicyError       an offline policy (it needs the future) where only online ones run
    │   ├── PolicyParamError         an unknown or ill-typed param; lists the params and defaults
    │   └── PolicyLoadError          a plugin's entry point that fails to import; says why
    └── PolicyStateError (also KeyError)
        ├── DuplicateKeyError        insert of a key the policy already holds
        └── UnknownKeyError          access, set_evictable or remove of a key it does not hold
"""

from __future__ import annotations

__all__ = [
    "DuplicateKeyError",
    "OfflinePolicyError",
    "PolicyConfigError",
    "PolicyLoadError",
    "PolicyParamError",
    "PolicyStateError",
    "SageEvictionError",
    "UnknownKeyError",
    "UnknownPolicyError",
]


class SageEvictionError(Exception):
    """Base of every error the policy library raises."""


class PolicyConfigError(SageEvictionError, ValueError):
    """A policy spec that cannot be built."""


class UnknownPolicyError(PolicyConfigError):
    """No policy has this name."""


class OfflinePolicyError(PolicyConfigError):
    """An offline policy (it needs the future, e.g. Belady) asked for where only online ones run:
    an engine, or an engine integration. The message lists the online policies."""


class PolicyParamError(PolicyConfigError):
    """A param the policy does not take, or a value of the wrong type."""


class PolicyLoadError(PolicyConfigError):
    """A plugin policy whose entry point cannot be loaded (its module missing or failing to
    import); the message names the policy and the error. The other policies stay usable."""


class PolicyStateError(SageEvictionError, KeyError):
    """An operation that contradicts what the policy holds."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class DuplicateKeyError(PolicyStateError):
    """The key is already in the policy."""


class UnknownKeyError(PolicyStateError):
    """The key is not in the policy."""
