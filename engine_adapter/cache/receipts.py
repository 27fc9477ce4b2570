"""Request receipts: what the cache did for each recent request, and why it missed what it missed.

``GET /v1/cache/requests/{id}`` and ``sage llm eviction explain --request ID`` read this
(issue 51, item 5; docs/architecture.md, "Request receipts"). `RequestReceipts` keeps, for the
last `RECEIPTS_CAPACITY` requests (the oldest dropped), each one's prompt tokens, the tokens it
read per tier (device, host, disk), wrote and left uncached, the lifetime granted (and the tokens
of it broken: dropped before expiry, `broken`), its tenant,
its salt and, block by block, why each block it missed was not in the cache:

- ``evicted``: the device policy evicted it at `at` (the ghost set's record: its eviction id,
  the ``id`` of its ``evict`` event, whose explanation ``eviction explain`` shows); ``lapsed``
  when its retention had lapsed before (`lapsed_at`);
- ``dropped``: it left the last tier below the device (`tier`, `at`, the drop's reason:
  ``evict``, ``orphan``, ``retention_break`` ...);
- ``explicit_mode`` / ``generated_not_stored``: a request held it and freed it at its finish
  instead of caching it (past its last breakpoint; generated tokens not cached);
- ``other_salt``: the same tokens are cached (or were seen) under another isolation key;
- ``retokenised``: a recent prompt under the same isolation key had the same text up to
  `text_chars` characters, tokenised into different tokens (a leading special token one route
  adds, a word cut at the end of one prompt and whole in the next): the blocks never cached
  that start within that text or at its first token past it (`engine_adapter.cache.text_marks`;
  only prompts sent as text have marks);
- ``first_use``: none of the above, and no window has forgotten anything yet, so it was never
  cached; ``unknown`` once a window has: it was never cached, or left beyond the windows;
- ``recomputed`` (the last token's block, recomputed for its logits) and ``partial_block``
  (the tail shorter than a block: only full blocks are cached).

Every memory here is bounded: the rows (`RECEIPTS_CAPACITY`), the why-window and the salt
window (first in first out, as many keys as the ghost set), the per-tenant-and-salt totals
(`MAX_TENANTS` rows, the rest under `OTHER_TENANTS`), the text window (the marks of recent
prompts: digests, never their text, first in first out, as many as the ghost set's keys).

Salts are tenants' secrets (vLLM's `cache_salt` exists to stop one tenant probing another's
prefixes): they appear only as `salt_label`, a short SHA-256 digest a holder of the salt can
compute. Called under the cache manager's lock. Imports `block_keys`, `ghosts`, `request`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine_adapter.cache.block_keys import block_hashes, format_block_key
from engine_adapter.cache.ghosts import Ghost
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.text_marks import TextMarks
from sage_eviction.metrics import MAX_TENANTS, OTHER_TENANTS

__all__ = [
    "LATEST",
    "MISS_REASONS",
    "Lookup",
    "RECEIPTS_CAPACITY",
    "RetentionOwner",
    "TOTAL_FIELDS",
    "MissWindows",
    "RequestReceipts",
    "salt_label",
]

RECEIPTS_CAPACITY = 4096
"""Requests whose receipts are kept (the oldest dropped first)."""

LATEST = "latest"
"""The id that names the last request admitted (the engine's ids start ``cmpl-``, ``chatcmpl-``
or ``msg_``, so it names no request of its own)."""

MISS_REASONS = (
    "evicted",
    "lapsed",
    "dropped",
    "explicit_mode",
    "generated_not_stored",
    "other_salt",
    "retokenised",
    "first_use",
    "unknown",
    "recomputed",
    "partial_block",
)
"""Why a prompt block was not read from the cache (the module docstring says each)."""

TOTAL_FIELDS = (
    "requests",
    "prompt_tokens",
    "read_device_tokens",
    "read_host_tokens",
    "read_disk_tokens",
    "written_tokens",
    "retention_granted_requests",
    "retention_refused_requests",
    "retention_broken_tokens",
)
"""The counters kept per tenant and salt (`RequestReceipts.accounts`)."""

RetentionOwner = tuple[str, "str | None", "str | None"]
"""Whose lifetime a retained block serves: the request id, tenant and salt label of the request
that last granted it (`Retention` keeps one per retained block, so a break is billed to it)."""


def salt_label(salt: str | None) -> str | None:
    """How a salt is shown: ``sha256:`` and 12 hex digits of its SHA-256 (None: no salt)."""
    if salt is None:
        return None
    return "sha256:" + hashlib.sha256(salt.encode("utf-8")).hexdigest()[:12]


class MissWindows:
    """Recent keys that left the cache or never entered it, and the salts tokens were seen under.

    Args:
        capacity: Keys each window keeps (first in first out; the ghost set's capacity).
    """

    __slots__ = ("_salts", "_texts", "_why", "capacity", "forgotten")

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._why: OrderedDict[Hashable, dict[str, Any]] = OrderedDict()
        self._salts: OrderedDict[Hashable, tuple[str | None, Hashable]] = OrderedDict()
        # (isolation key, text digest) of a recent prompt's mark -> its (tokens, token digest)
        self._texts: OrderedDict[tuple[str | None, bytes], tuple[int, bytes]] = OrderedDict()
        self.forgotten = 0  # keys pushed out of the why-window (then `first_use` is uncertain)

    def note(self, key: Hashable, why: dict[str, Any]) -> None:
        """Why `key` is not cached now (replacing what was said of it before)."""
        window = self._why
        window.pop(key, None)
        window[key] = why
        if len(window) > self.capacity:
            window.popitem(last=False)
            self.forgotten += 1

    def why(self, key: Hashable) -> dict[str, Any] | None:
        """What was noted of `key`, or None."""
        return self._why.get(key)

    def seen_under(self, unsalted: Sequence[Hashable], salt: str | None, keys: Sequence[Hashable]) -> None:
        """A prompt under isolation key `salt` (`keys`) whose blocks, unsalted, are `unsalted`."""
        salts = self._salts
        for plain, key in zip(unsalted, keys, strict=False):
            salts.pop(plain, None)
            salts[plain] = (salt, key)
        for _ in range(len(salts) - self.capacity):
            salts.popitem(last=False)

    def other_salt(self, plain: Hashable, salt: str | None) -> tuple[str | None, Hashable] | None:
        """(salt, key) of the last prompt seen with block `plain` under a salt other than `salt`."""
        seen = self._salts.get(plain)
        return None if seen is None or seen[0] == salt else seen

    def saw_text(self, salt: str | None, marks: TextMarks) -> None:
        """A prompt under isolation key `salt` with text marks `marks` (the latest wins a mark)."""
        texts = self._texts
        for digest, tokens, token_digest in zip(marks.text, marks.tokens, marks.token_digest, strict=True):
            key = (salt, digest)
            texts.pop(key, None)
            texts[key] = (tokens, token_digest)
        for _ in range(len(texts) - self.capacity):
            texts.popitem(last=False)

    def retokenised(self, salt: str | None, marks: TextMarks) -> tuple[int, int] | None:
        """(characters, tokens): the longest text of `marks` a recent prompt under `salt` had
        too, and how many of this prompt's tokens end within it, when the two tokenised it
        differently (different tokens, or as many tokens digesting differently); None when the
        longest shared text was tokenised alike, or none was seen."""
        texts = self._texts
        for k in range(len(marks) - 1, -1, -1):
            seen = texts.get((salt, marks.text[k]))
            if seen is not None:
                mine = (marks.tokens[k], marks.token_digest[k])
                return None if seen == mine else (marks.chars[k], mine[0])
        return None

    def clear(self) -> None:
        """A cache reset: what was said of the keys no longer holds."""
        self._why.clear()
        self._salts.clear()
        self._texts.clear()
        self.forgotten = 0


@dataclass(slots=True)
class _Row:
    """One request's receipt (rendered by `RequestReceipts.get`)."""

    request_id: str
    tenant: str | None
    salt: str | None
    session_key: str | None
    admitted_at: float
    prompt_tokens: int
    block_size: int
    read: tuple[int, int, int]  # device, host, disk tokens
    misses: list[dict[str, Any]]
    receipt: Any = None  # the request's CacheReceipt (written tokens, lifetime: filled as it runs)
    retention_ttl_s: float | None = None
    broken_blocks: int = 0  # blocks of its lifetime dropped before expiry (`broken`)


@dataclass(slots=True)
class Lookup:
    """What `Admission` knows of one admitted lookup."""

    keys: Sequence[Hashable]
    salt: str | None
    n_hit: int
    matchable: int
    n_tokens: int
    read: tuple[int, int, int]
    ghosts: Sequence[tuple[int, Ghost, bool]] = field(default_factory=tuple)


class RequestReceipts:
    """The last `capacity` requests' receipts and the totals per tenant and salt.

    Args:
        block_size: Tokens per block.
        window: Keys each `MissWindows` window keeps (the ghost set's capacity).
        clock: The cache's clock.
        cached: Whether a key is in some tier now (the device index or a tier below).
        ghost: Whether a key is in the ghost set (evicted not long ago); None: never.
        capacity: Receipts kept.
    """

    def __init__(
        self,
        block_size: int,
        window: int,
        clock: Callable[[], float],
        cached: Callable[[Hashable], bool],
        ghost: Callable[[Hashable], bool] | None = None,
        capacity: int = RECEIPTS_CAPACITY,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"receipts capacity={capacity} must be at least 1")
        self.block_size, self.capacity = block_size, capacity
        self.windows = MissWindows(window)
        self.ghosted = 0  # keys ever given to the ghost set (past its capacity it forgets)
        self.ghost_capacity = window
        self.reset_at: float | None = None  # the last cache reset: it drops blocks unremembered
        self._after_reset: dict[str, Any] = {}
        self._clock, self._cached = clock, cached
        self._ghost: Callable[[Hashable], bool] = ghost or (lambda key: False)
        self._rows: OrderedDict[str, _Row] = OrderedDict()
        self._totals: dict[tuple[str | None, str | None], list[int]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    # ---- what the cache tells it ----------------------------------------------------------------

    def on_lookup(self, request: CacheRequest, lookup: Lookup) -> None:
        """A request's admitted lookup: its receipt at its first admission (a re-admission after
        a preemption keeps the first), the salt window, and the totals of what it read."""
        rid = str(request.sequence_id) if request.request_id is None else request.request_id
        unsalted = self._unsalted(request, lookup)
        if rid not in self._rows:
            self._add_row(rid, request, lookup, unsalted)
        for i, ghost, _ in lookup.ghosts:  # the ghost set forgets a ghost once found: remember it
            self.windows.note(lookup.keys[i], _evicted(ghost, lookup.keys[i]))
        if unsalted is not None and lookup.salt is not None:  # after its own reasons were found
            self.windows.seen_under(unsalted, lookup.salt, lookup.keys)
        if request.text_marks is not None:
            self.windows.saw_text(lookup.salt, request.text_marks)

    def _add_row(
        self, rid: str, request: CacheRequest, lookup: Lookup, unsalted: Sequence[Hashable] | None
    ) -> None:
        """The receipt of a request's first admission, and the totals of what it read."""
        misses = self._reasons(request, lookup, unsalted)
        contract = request.contract
        session = None if contract is None else contract.session_key
        row = _Row(
            rid, request.tenant, salt_label(_salt_of(request)), session, self._clock(),
            lookup.n_tokens, self.block_size, lookup.read, misses, request.receipt,
        )  # fmt: skip
        rows = self._rows
        rows[rid] = row
        if len(rows) > self.capacity:
            rows.popitem(last=False)
        totals = self._account(request.tenant, row.salt)
        totals[0] += 1
        totals[1] += lookup.n_tokens
        for i, tokens in enumerate(lookup.read):
            totals[2 + i] += tokens

    def _unsalted(self, request: CacheRequest, lookup: Lookup) -> Sequence[Hashable] | None:
        """The prompt's block keys under no salt (its own keys when it has none; None without
        token ids: then no salt is checked)."""
        if lookup.salt is None:
            return lookup.keys
        if request.token_ids is None:
            return None
        n = len(lookup.keys) * self.block_size
        return block_hashes(request.token_ids[:n], self.block_size, salt=None)

    def wrote(self, request: CacheRequest, tokens: int) -> None:
        """`request` newly wrote `tokens` prompt tokens to the cache."""
        self._account(request.tenant, salt_label(_salt_of(request)))[5] += tokens

    def retention(self, request: CacheRequest, granted: bool) -> None:
        """`request` was granted its lifetime (`granted`), or refused some of it."""
        self._account(request.tenant, salt_label(_salt_of(request)))[6 if granted else 7] += 1

    def owner(self, request: CacheRequest) -> RetentionOwner:
        """What a block `request` retains is billed to when its lifetime breaks (`broken`)."""
        rid = str(request.sequence_id) if request.request_id is None else request.request_id
        return (rid, request.tenant, salt_label(_salt_of(request)))

    def broken(self, owner: RetentionOwner) -> None:
        """A block retained for `owner` was dropped before its expiry: one block's tokens to its
        tenant and salt's total and, while its receipt is in the table, to the request."""
        rid, tenant, salt = owner
        self._account(tenant, salt)[8] += self.block_size
        row = self._rows.get(rid)
        if row is not None:
            row.broken_blocks += 1

    def on_evicted(self, n: int) -> None:
        """`n` more keys went to the ghost set."""
        self.ghosted += n

    def lapsed(self, key: Hashable, at: float) -> None:
        """`key`'s retention lapsed at `at` (it may be evicted from now on)."""
        self.windows.note(key, {"reason": "lapsed", "lapsed_at": at})

    def dropped(self, key: Hashable, tier: str, reason: str) -> None:
        """`key` left tier `tier`, the last it was in, for `reason`."""
        self.windows.note(key, {"reason": "dropped", "tier": tier, "at": self._clock(), "why": reason})

    def not_written(self, keys: Sequence[Hashable], start: int, prompt_blocks: int) -> None:
        """A finished request freed blocks ``start ..`` (`keys`) instead of caching them: past its
        last breakpoint (below `prompt_blocks`) or generated."""
        now = self._clock()
        for i, key in enumerate(keys):
            reason = "explicit_mode" if start + i < prompt_blocks else "generated_not_stored"
            self.windows.note(key, {"reason": reason, "at": now})

    def clear(self) -> None:
        """A cache reset: the windows go (receipts and totals stay: they are history)."""
        self.windows.clear()
        self.ghosted = 0
        self.reset_at = self._clock()
        note = "never cached, or dropped by the cache reset"
        self._after_reset = {"reason": "unknown", "note": note, "at": self.reset_at}

    # ---- the reasons ----------------------------------------------------------------------------

    def _reasons(
        self, request: CacheRequest, lookup: Lookup, unsalted: Sequence[Hashable] | None
    ) -> list[dict[str, Any]]:
        """Runs of missed blocks with one reason each, in prompt order. A fresh prompt's blocks
        share one constant reason (`_FIRST_USE`), so a long miss costs a few lookups per block and
        no allocation."""
        ghosts = {i: ghost for i, ghost, _ in lookup.ghosts}
        runs: list[dict[str, Any]] = []
        keys, bs, last = lookup.keys, self.block_size, None
        told: tuple[dict[str, Any] | None, int] | None = None  # at the first block never cached
        for i in range(lookup.n_hit, len(keys)):
            if i >= lookup.matchable:
                why = _RECOMPUTED
            else:
                plain = None if unsalted is None or i >= len(unsalted) else unsalted[i]
                why = self._why(keys[i], ghosts.get(i), plain, lookup.salt)
                if (why is _FIRST_USE or why is _UNKNOWN) and request.text_marks is not None:
                    told = told or _retokenised(self.windows.retokenised(lookup.salt, request.text_marks))
                    if told[0] is not None and i * bs <= told[1]:  # it starts in the text, or with
                        why = told[0]  # the first token past it, which may be the one tokenised otherwise
            if last is not None and (why is last or _same(runs[-1], why)):  # the run goes on
                runs[-1]["blocks"] += 1
                runs[-1]["tokens"] += bs
            else:
                runs.append({"first_block": i, "blocks": 1, "tokens": bs, **why})
            last = why
        tail = lookup.n_tokens - len(keys) * self.block_size
        if tail > 0:
            runs.append({"first_block": len(keys), "blocks": 1, "tokens": tail, "reason": "partial_block"})
        return runs

    def _why(
        self, key: Hashable, ghost: Ghost | None, plain: Hashable | None, salt: str | None
    ) -> dict[str, Any]:
        """Why one matchable block missed: the ghost set first, then the windows, then salts."""
        noted = self.windows.why(key)
        if ghost is not None:
            why = _evicted(ghost, key)
            if noted is not None and noted["reason"] == "lapsed":
                why["reason"], why["lapsed_at"] = "lapsed", noted["lapsed_at"]
            return why
        if noted is not None and noted["reason"] != "lapsed":
            return dict(noted)
        if plain is not None:
            other = self._other_salt(plain, salt)
            if other is not None:
                return other
        if self.reset_at is not None:
            return self._after_reset
        if self.ghosted <= self.ghost_capacity and not self.windows.forgotten:
            return _FIRST_USE
        return _UNKNOWN

    def _other_salt(self, plain: Hashable, salt: str | None) -> dict[str, Any] | None:
        """The block cached (or seen) under an isolation key other than `salt`, or None."""
        if salt is not None:  # the same tokens under no salt: their keys are the unsalted ones
            if self._cached(plain):
                return {"reason": "other_salt", "salt": None, "cached": True}
            if self._ghost(plain) or self.windows.why(plain) is not None:
                return {"reason": "other_salt", "salt": None, "cached": False}
        seen = self.windows.other_salt(plain, salt)
        if seen is None:
            return None
        return {"reason": "other_salt", "salt": salt_label(seen[0]), "cached": self._cached(seen[1])}

    # ---- what it answers ------------------------------------------------------------------------

    def get(self, request_id: str) -> dict[str, Any] | None:
        """The receipt of `request_id` as JSON (``latest``: the last request admitted), or None
        (unknown, or dropped from the table)."""
        rows = self._rows
        row = rows.get(request_id)
        if row is None and request_id == LATEST and rows:
            row = rows[next(reversed(rows))]
        if row is None:
            return None
        receipt = row.receipt
        written = 0 if receipt is None else int(receipt.written_tokens)
        ttl = None if receipt is None else receipt.retention_ttl_s
        read = sum(row.read)
        return {
            "id": row.request_id,
            "tenant": row.tenant,
            "salt": row.salt,
            "session_key": row.session_key,
            "admitted_at": row.admitted_at,
            "block_size": row.block_size,
            "prompt_tokens": row.prompt_tokens,
            "read_tokens": {"device": row.read[0], "host": row.read[1], "disk": row.read[2]},
            "cached_tokens": read,
            "written_tokens": written,
            "uncached_tokens": max(row.prompt_tokens - read - written, 0),
            "retention_ttl_s": ttl,
            "retention_refused": ttl == 0.0,
            "retention_broken_tokens": row.broken_blocks * row.block_size,
            "misses": [dict(run) for run in row.misses],
            "window": {"requests": self.capacity, "blocks": self.windows.capacity},
        }

    def accounts(self) -> list[dict[str, Any]]:
        """The totals per tenant and salt (`TOTAL_FIELDS`), in order of first appearance."""
        return [
            {"tenant": tenant, "salt": salt, **dict(zip(TOTAL_FIELDS, counts, strict=True))}
            for (tenant, salt), counts in self._totals.items()
        ]

    def _account(self, tenant: str | None, salt: str | None) -> list[int]:
        totals = self._totals
        found = totals.get((tenant, salt))
        if found is None:
            if len(totals) >= MAX_TENANTS - 1:  # past the cap (the other row one of them): together
                tenant, salt = OTHER_TENANTS, None
                found = totals.get((tenant, salt))
            if found is None:
                found = totals[(tenant, salt)] = [0] * len(TOTAL_FIELDS)
        return found


_FIRST_USE: dict[str, Any] = {"reason": "first_use"}
_RECOMPUTED: dict[str, Any] = {"reason": "recomputed"}
_UNKNOWN: dict[str, Any] = {"reason": "unknown", "note": "never cached, or left the cache beyond the windows"}
"""Reasons shared by every block they explain (never changed: runs copy them)."""


def _evicted(ghost: Ghost, key: Hashable) -> dict[str, Any]:
    """The reason of a block its ghost says was evicted."""
    return {
        "reason": "evicted", "at": ghost.evicted_at, "policy": ghost.policy,
        "eviction_id": ghost.eviction_id, "block": format_block_key(key),
    }  # fmt: skip


def _retokenised(found: tuple[int, int] | None) -> tuple[dict[str, Any] | None, int]:
    """The reason `MissWindows.retokenised` found (characters, tokens) gives, and the tokens."""
    if found is None:
        return None, -1
    return {"reason": "retokenised", "text_chars": found[0]}, found[1]


def _salt_of(request: CacheRequest) -> str | None:
    """The salt a request is shown and counted under: its `cache_salt` (a tenant used as the
    isolation key with `--isolate-tenants` is shown as the tenant)."""
    return request.cache_salt


def _same(run: dict[str, Any], why: dict[str, Any]) -> bool:
    """One reason: the same kind, and the same time, policy, tier and salt where they apply."""
    return all(
        run.get(k) == why.get(k)
        for k in ("reason", "at", "policy", "tier", "salt", "lapsed_at", "why", "text_chars")
    )
