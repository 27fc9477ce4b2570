"""The radix model with prompt-cache contracts (issue 51): the engine's retention, in the simulator.

A workload whose requests carry contract fields (`engine_adapter.sim.contracts`) runs its radix
rows through `ContractRadixModel`: the same `CacheManager` as every radix row, each request
handed to it with its `CacheContract` (session key, lifetime, explicit-mode write limit), its
salt and a `CacheReceipt`, as the engine's scheduler hands them. Retention, demotion instead of
dropping, breaks, explicit writes and their counting are therefore the cache core's own
(`engine_adapter.cache.retention`, `sequences`), not a model of them. The compiled radix loop
has none of this, so such a row runs in the Python loop and says so (`event_loop`
``python (prompt-cache contracts: ...)``).

What the row gains (`SimResult.cache_contract`, docs/reference/simulator.md):

- `retention_hit_blocks`: blocks of first admissions' hits whose retention was unexpired at
  the lookup; the cache's retention counters in blocks (granted, refused, broken, expired);
- `written_tokens` per tier: the prompt tokens the requests wrote to the device cache (their
  receipts' sum), and the blocks copied into host and disk (demotions, write-through copies);
- `read_tokens` per tier: the tokens first admissions were served from each tier;
- `idle_block_s` per tier: the integral over simulated time of the blocks held but referenced
  by no running request (device: cached blocks with no reference; host and disk: every entry).
  The cache changes only inside the calls below, so the counts are constant between them and
  the integral is exact: each call adds the counts the last one left times the time between
  (counted once per point in time: a step's calls share its clock).

Memory: a receipt per request in flight, dropped when it finishes; the figures are counters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any

from engine_adapter.cache.contract import CacheContract, CacheReceipt
from engine_adapter.cache.request import CacheRequest
from engine_adapter.sim.cache_models import RadixModel, cache_request
from engine_adapter.sim.sequence import SimSequence
from engine_adapter.sim.sim_result import TierLoads

__all__ = ["CONTRACT_LOOP_REASON", "TIER_NAMES", "ContractRadixModel", "contract_figures"]

CONTRACT_LOOP_REASON = "prompt-cache contracts: retention runs in the cache manager"
"""Why a contract row runs in the Python loop (its `event_loop`)."""

TIER_NAMES = ("device", "host", "disk")


class ContractRadixModel(RadixModel):
    """`RadixModel` handing each request's contract to the cache, with the contract figures."""

    def __init__(self, manager: Any, belady: Any) -> None:
        super().__init__(manager, belady)
        self._receipts: dict[int, CacheReceipt] = {}  # by sid, while in flight
        self._bs: int = manager.block_size
        self.retention_hits = 0
        self.written_tokens = 0
        self.read_tokens = [0, 0, 0]
        self.idle_block_s = [0.0, 0.0, 0.0]
        self._held = [0, 0, 0]  # idle blocks per tier since `_since`
        self._since: float | None = None
        self._changed = False  # a call changed the cache since `_held` was counted
        self._running: dict[int, Sequence[Hashable]] = {}  # the admitted requests' keys, by sid

    # ---- the requests as the engine's scheduler hands them --------------------------------------

    def _request(self, seq: SimSequence) -> CacheRequest:
        request = self._requests.get(seq.sid)
        if request is None or request.num_tokens != seq.tokens:
            r = seq.request
            receipt = self._receipts.get(seq.sid)
            if receipt is None:  # one per request: a re-admission after preemption keeps it
                receipt = self._receipts[seq.sid] = CacheReceipt(seq.prompt_tokens)
            contract = CacheContract(r.session, r.cache_ttl_s, r.cache_breakpoint)
            request = self._requests[seq.sid] = dataclasses.replace(
                cache_request(seq), cache_salt=r.cache_salt, contract=contract, receipt=receipt
            )
        return request

    # ---- the calls that change the cache: the idle integral around each -------------------------

    def _advance(self, now: float | None = None) -> None:
        """Add the idle blocks held since the last call up to `now` (default: the manager's
        clock). They are counted here, lazily, from the cache as the last call left it (nothing
        else changes it), and only when time has moved: a step's calls share one clock."""
        if now is None:
            now = self.manager.clock()
        since = self._since
        if since is None or now > since:
            if since is not None:
                if self._changed:
                    self._measure()
                    self._changed = False
                dt = now - since
                for i, held in enumerate(self._held):
                    self.idle_block_s[i] += held * dt
            self._since = now

    def _measure(self) -> None:
        """The idle blocks per tier now (module docstring). Without a lower tier, the device's
        are the reclaimable blocks and the retention-pinned ones no running request references:
        every referenced cached block is among the running requests' keys, so these are counted
        there (bounded by the batch), not over every retained block."""
        manager = self.manager
        radix = manager.radix
        device = radix.num_reclaimable
        if radix.num_pinned:
            get = radix.get
            referenced = {
                id(b)
                for keys in self._running.values()
                for k in keys
                if (b := get(k)) is not None and b.pin_count > 0 and b.ref_count > 0
            }
            device += radix.num_pinned - len(referenced)
        held = [device, 0, 0]
        if manager.tiers is not None:
            for i, level in enumerate(manager.tiers.levels, start=1):
                held[i] = len(level)
        self._held = held

    def _retained(self, keys: Sequence[object]) -> list[bool] | None:
        """Which of `keys` hold an unexpired retention now (None: none does)."""
        expiry = self.manager.retention.expiry
        if not expiry:
            return None
        now = self.manager.clock()
        return [expiry.get(k, now) > now for k in keys]

    def allocate(self, seq: SimSequence) -> int | None:
        self._advance()
        first = seq.epoch == 0
        retained = self._retained(seq.keys) if first else None
        hits = super().allocate(seq)
        self._changed = True
        if hits is None:
            return hits
        self._running[seq.sid] = seq.keys
        if not first:
            return hits
        if retained is not None:
            self.retention_hits += sum(retained[:hits])
        loaded = self.loaded if self.manager.tiers is not None else TierLoads()
        host, disk = loaded.host_blocks * self._bs, loaded.disk_blocks * self._bs
        served = min(hits * self._bs, seq.request.input_len)
        self.read_tokens[0] += max(served - host - disk, 0)
        self.read_tokens[1] += host
        self.read_tokens[2] += disk
        return hits

    def prefetch(self, seq: SimSequence) -> TierLoads:
        self._advance()
        loads = super().prefetch(seq)
        self._changed = True
        return loads

    def reserve(self, seq: SimSequence, tokens: int) -> bool:
        self._advance()
        done = super().reserve(seq, tokens)
        self._changed = True
        return done

    def reserve_many(self, wants: Sequence[tuple[SimSequence, int]]) -> int:
        self._advance()
        done = super().reserve_many(wants)
        self._changed = True
        return done

    def preempt(self, seq: SimSequence) -> None:
        self._advance()
        super().preempt(seq)
        self._changed = True
        self._running.pop(seq.sid, None)

    def free(self, seq: SimSequence) -> None:
        self._advance()
        super().free(seq)
        self._changed = True
        self._running.pop(seq.sid, None)
        receipt = self._receipts.pop(seq.sid, None)
        if receipt is not None:
            self.written_tokens += receipt.written_tokens

    # ---- the row ----------------------------------------------------------------------------------

    def contract_figures(self, end_s: float) -> dict[str, Any]:
        """The row's `cache_contract` (module docstring), the idle integral taken to `end_s` (the
        run's last event)."""
        self._advance(end_s)
        manager = self.manager
        written = [self.written_tokens, 0, 0]
        if manager.tiers is not None:
            for i, level in enumerate(manager.tiers.levels, start=1):
                written[i] = level.moved_in * self._bs
        counters = manager.retention_counters()
        return {
            "retention_hit_blocks": self.retention_hits,
            **counters,
            "written_tokens": dict(zip(TIER_NAMES, written, strict=True)),
            "read_tokens": dict(zip(TIER_NAMES, self.read_tokens, strict=True)),
            "idle_block_s": dict(zip(TIER_NAMES, self.idle_block_s, strict=True)),
        }


def contract_figures(cache: object, end_s: float) -> dict[str, Any] | None:
    """A row's `cache_contract`: the contract model's figures, None for any other model."""
    return cache.contract_figures(end_s) if isinstance(cache, ContractRadixModel) else None
