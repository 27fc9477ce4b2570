"""A request's block keys: how many tokens its prompt has, its isolation key, the chained keys of
its full blocks, how many of them a lookup may match, and a running sequence's computed keys.

`PromptKeys` is configured once per cache manager (block size, tenant isolation) and applies
`block_keys` to what callers give: a `CacheRequest`, or the token ids / block keys of a pinned
prefix, a commit or a release. Imports `block_keys`, `records` and `request`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from engine_adapter.cache.block_keys import block_hashes, root_key
from engine_adapter.cache.records import SequenceState
from engine_adapter.cache.request import CacheRequest

__all__ = ["PromptKeys"]


class PromptKeys:
    """Block keys of prompts for one cache (its block size and isolation rule).

    Args:
        block_size: Tokens per block.
        isolate_tenants: Use the tenant as isolation key when a request gives no ``cache_salt``.
    """

    __slots__ = ("block_size", "isolate_tenants")

    def __init__(self, block_size: int, isolate_tenants: bool) -> None:
        self.block_size = block_size
        self.isolate_tenants = isolate_tenants

    def salt(self, cache_salt: str | None, tenant: str | None) -> str | None:
        """The isolation key: the salt, else the tenant when tenants are isolated."""
        if cache_salt is not None:
            return cache_salt
        return tenant if self.isolate_tenants else None

    def num_tokens(
        self, token_ids: Sequence[int] | None, block_keys: Sequence[Hashable] | None, num_tokens: int | None
    ) -> int:
        """The prompt's length in tokens (`num_tokens`, or what the ids or keys imply).

        Raises:
            ValueError: Neither ids nor keys, more tokens than ids, or a negative count.
        """
        if num_tokens is None:
            if token_ids is not None:
                num_tokens = len(token_ids)
            elif block_keys is not None:
                num_tokens = len(block_keys) * self.block_size
            else:
                raise ValueError("give token_ids, or num_tokens with block_keys")
        elif token_ids is not None and num_tokens > len(token_ids):
            raise ValueError(f"num_tokens={num_tokens} exceeds the {len(token_ids)} token ids given")
        if token_ids is None and block_keys is None:
            raise ValueError("give token_ids or block_keys to match against the prefix cache")
        if num_tokens < 0:
            raise ValueError(f"num_tokens={num_tokens} is negative")
        return num_tokens

    def keys(
        self,
        token_ids: Sequence[int] | None,
        block_keys: Sequence[Hashable] | None,
        num_tokens: int,
        salt: str | None,
    ) -> list[Hashable]:
        """Keys of the prompt's full blocks: the given keys, or the token ids hashed."""
        n_full = num_tokens // self.block_size
        if block_keys is not None:
            return list(block_keys[:n_full])
        assert token_ids is not None  # num_tokens() has checked that one of the two is given
        return list(block_hashes(token_ids[: n_full * self.block_size], self.block_size, salt=salt))

    def of(self, request: CacheRequest) -> tuple[int, str | None, list[Hashable]]:
        """A request's prompt length, isolation key and full-block keys.

        Raises:
            ValueError: As `num_tokens`.
        """
        token_ids, block_keys = request.token_ids, request.block_keys
        n_tokens = self.num_tokens(token_ids, block_keys, request.num_tokens)
        salt = self.salt(request.cache_salt, request.tenant)
        return n_tokens, salt, self.keys(token_ids, block_keys, n_tokens, salt)

    def prefix(
        self,
        token_ids: Sequence[int] | None,
        block_keys: Sequence[Hashable] | None,
        tenant: str | None,
        cache_salt: str | None,
    ) -> list[Hashable]:
        """Keys of the full blocks of a prefix given by its token ids or keys (a pinned prompt).

        Raises:
            ValueError: As `num_tokens`.
        """
        n_tokens = self.num_tokens(token_ids, block_keys, None)
        return self.keys(token_ids, block_keys, n_tokens, self.salt(cache_salt, tenant))

    def matchable(self, num_tokens: int, recompute_last_token: bool) -> int:
        """Leading blocks a lookup may serve from cache (never the last token's, if recomputed)."""
        if recompute_last_token:
            return max(num_tokens - 1, 0) // self.block_size
        return num_tokens // self.block_size

    def computed(
        self,
        seq: SequenceState,
        token_ids: Sequence[int] | None,
        block_keys: Sequence[Hashable] | None,
        num_computed_tokens: int | None,
    ) -> list[Hashable]:
        """Keys of the sequence's full, computed blocks that it holds (extends its known chain).

        Raises:
            ValueError: More computed tokens than token ids given.
        """
        if seq.compressed:
            return []  # compacted K/V are not the prefix their tokens name: never cached
        bs = self.block_size
        if num_computed_tokens is None:
            if token_ids is not None:
                num_computed_tokens = len(token_ids)
            elif block_keys is not None:
                num_computed_tokens = len(block_keys) * bs
            else:
                num_computed_tokens = seq.num_tokens
        elif token_ids is not None and num_computed_tokens > len(token_ids):
            raise ValueError(
                f"num_computed_tokens={num_computed_tokens} exceeds the {len(token_ids)} token ids given"
            )
        n_full = min(num_computed_tokens // bs, len(seq.block_table))
        if block_keys is not None:
            return list(block_keys[:n_full])
        known = seq.keys
        if len(known) < n_full and token_ids is not None and seq.request.block_keys is None:
            parent = known[-1] if known else root_key(seq.salt)
            assert isinstance(parent, int)
            known.extend(block_hashes(token_ids[: n_full * bs], bs, parent=parent, start_block=len(known)))
        return known[:n_full]
