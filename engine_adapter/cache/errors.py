"""Exceptions raised by the KV pool, the radix cache and the cache manager.

The tree::

    SageCacheError
    ├── PoolExhaustedError (also MemoryError)    fewer free blocks than asked; nothing changed
    │   └── NoEvictableBlocksError               eviction cannot free enough; preempt or wait
    ├── RequestTooLargeError (also ValueError)   a request needs more blocks than the pool has
    ├── PinLimitError (also ValueError)          a pin beyond `max_pinned_ratio`; nothing changed
    ├── BlockStateError (also ValueError)        double free, out-of-range id, unlock below zero
    ├── SequenceExistsError (also ValueError)    allocate for a sequence id already running
    ├── UnknownSequenceError (also KeyError)     a sequence id the manager does not hold
    └── CacheInvariantError (also AssertionError) the cache's books disagree (a bug; tests look for it)

Imports nothing.
"""

from __future__ import annotations

__all__ = [
    "BlockStateError",
    "CacheInvariantError",
    "NoEvictableBlocksError",
    "PinLimitError",
    "PoolExhaustedError",
    "RequestTooLargeError",
    "SageCacheError",
    "SequenceExistsError",
    "UnknownSequenceError",
]


class SageCacheError(Exception):
    """Base of every error the cache layer raises."""


class PoolExhaustedError(SageCacheError, MemoryError):
    """Fewer free blocks than requested; the pool is unchanged."""


class NoEvictableBlocksError(PoolExhaustedError):
    """Even after evicting every evictable block there would be too few free; nothing changed.

    The scheduler answers this by preempting a running sequence (or by waiting).
    """


class RequestTooLargeError(SageCacheError, ValueError):
    """A request needs more blocks than the whole pool holds: it can never run."""


class PinLimitError(SageCacheError, ValueError):
    """Pinning would exceed `max_pinned_ratio` of the pool; nothing was pinned."""


class BlockStateError(SageCacheError, ValueError):
    """A block operation that contradicts the block's state (double free, bad id, ref count)."""


class UnknownSequenceError(SageCacheError, KeyError):
    """The manager holds no sequence with this id."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class SequenceExistsError(SageCacheError, ValueError):
    """The manager already holds a sequence with this id."""


class CacheInvariantError(SageCacheError, AssertionError):
    """The pool, the tree and the policy disagree: a bug, reported by `check_invariants`."""
