"""The simulator's cache models as objects: each carries its own options, checks them, builds the
model a run uses, and says whether its row runs in a compiled loop and, when not, why.

A name resolves to one (`cache_model_for`): ``Simulator(cache_model="radix")``,
``simulate(cache_model=...)`` and ``--cache-model NAME`` are unchanged, and the names are
`model_names.EVENT_LOOP_MODELS` (the one list; the registry below must cover it exactly).

- `RadixCacheModel`: sage's engine's cache (`cache_models.RadixModel`), with its options: queue
  protection, adaptive batch, KV tiers, compress-on-evict, `compiled`, the scheduler's preemption
  order. A plain row runs in one compiled call (`radix_run`); its `event_loop` says why a row did
  not. A workload carrying prompt-cache contracts runs `contract_model.ContractRadixModel` in the Python loop.
- `FlatCacheModel`: libCacheSim's model (`cache_models.FlatModel`); no options. Compiled where
  the flat cache keeps its policy's state in C (`flat_run`).
- `SGLangCacheModel`: SGLang's radix cache and scheduler (`twins.sglang_model.SGLangModel`), with
  its queue order; always the Python loop (the tree is modelled in Python).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.tiers import TierConfig
from engine_adapter.sim import flat_run, radix_run
from engine_adapter.sim.cache_models import FlatModel, RadixBelady, RadixModel
from engine_adapter.sim.contract_model import CONTRACT_LOOP_REASON, ContractRadixModel
from engine_adapter.sim.model_names import EVENT_LOOP_MODELS, SCHEDULE_POLICIES, TWINS
from engine_adapter.sim.run_state import RunRequests, RunState
from engine_adapter.sim.twins.sglang_model import SGLangModel
from engine_adapter.sim.workloads import Workload, any_contract, int64_keys
from sage_eviction import get_policy_class
from sage_eviction.policies.belady import BeladyPolicy
from sage_eviction.preemption import POLICY, resolve_order

__all__ = [
    "COMPILED",
    "CacheModelKind",
    "FlatCacheModel",
    "RadixCacheModel",
    "SGLangCacheModel",
    "TwinCacheModel",
    "ModelOptions",
    "cache_model_for",
    "model_traits",
]

COMPILED = "compiled"
"""A row's `event_loop` when it ran in one compiled call; otherwise ``"python (<why>)"``."""

RunModel = RadixModel | SGLangModel | FlatModel


class ModelHost(Protocol):
    """What a cache model reads of the `Simulator` that runs it."""

    @property
    def workload(self) -> Workload: ...
    @property
    def block_size(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def unbounded(self) -> bool: ...
    @property
    def policy_spec(self) -> str: ...
    @property
    def tiers(self) -> TierConfig | None: ...
    @property
    def horizon(self) -> float | None: ...
    def _now(self) -> float: ...


class CacheModelKind:
    """A cache model with its options (a subclass per model; `cache_model_for` builds one)."""

    name: ClassVar[str]
    holds_running: ClassVar[bool] = True
    """The pool holds the running requests' blocks, so a capacity must fit the largest request."""
    radix_options: ClassVar[bool] = False
    """Takes sage's radix cache's options: KV tiers, adaptive batch, queue protection,
    compress-on-evict (they need its tree and the engine's scheduler hooks)."""
    online_only: ClassVar[bool] = False
    """An engine's own eviction: no offline reference row (Belady)."""
    queue_orders: ClassVar[bool] = False
    """Has SGLang's queue orders (`SCHEDULE_POLICIES`); the others admit first come, first served."""
    reserved_blocks: ClassVar[int] = 0
    """Pool blocks the engine keeps for itself (vLLM's null block): a capacity holds that many less."""

    @classmethod
    def from_options(cls, options: ModelOptions) -> CacheModelKind:
        """The model with what it takes of `options` (`cache_model_for` has refused the options
        its traits rule out)."""
        return cls()

    def policy_name(self, spec: str) -> str:
        """The row's policy: sage's registry name of `spec`'s policy."""
        return get_policy_class(spec.split(":", 1)[0]).name

    def build(self, sim: ModelHost, requests: RunRequests) -> RunModel:
        """The model one run uses."""
        raise NotImplementedError

    def run_compiled(self, sim: Any, st: RunState) -> str | None:
        """Run the whole of `st` in a compiled loop: None when it did, else why the Python loop
        must run (nothing done)."""
        return f"the {self.name} model has no compiled loop"

    @staticmethod
    def pool_blocks(sim: ModelHost) -> int:
        """The capacity, or (unbounded) room for every distinct and every private block at once."""
        bs = sim.block_size
        num_blocks = sim.capacity
        if sim.unbounded:
            for r in sim.workload.requests:
                prompt = max(r.input_len, len(r.block_hashes) * bs)
                num_blocks += -(-(prompt + max(r.output_len - 1, 0)) // bs) - len(r.block_hashes)
        return num_blocks


@dataclass(frozen=True, slots=True)
class RadixCacheModel(CacheModelKind):
    """sage's engine's radix cache (`Simulator`'s Args say what each option does)."""

    name: ClassVar[str] = "radix"
    radix_options: ClassVar[bool] = True
    protect_queued: float = 0.0
    adaptive_batch: bool = False
    compiled: bool | None = None
    compress_on_evict: str | None = None
    preemption_order: str = POLICY

    @classmethod
    def from_options(cls, options: ModelOptions) -> RadixCacheModel:
        o = options
        return cls(o.protect_queued, o.adaptive_batch, o.compiled, o.compress_on_evict, o.preemption_order)

    def build(self, sim: ModelHost, requests: RunRequests) -> RadixModel:
        num_blocks = self.pool_blocks(sim)
        manager = CacheManager(
            BlockAllocator(num_blocks, sim.block_size),
            policy=sim.policy_spec,
            record_events=False,
            clock=sim._now,
            protect_queued=0.0 if sim.unbounded else self.protect_queued,
            compiled=self.compiled,
            tiers=sim.tiers,
            compress_on_evict=None if sim.unbounded else self.compress_on_evict,
            int_keys=int64_keys(sim.workload.requests),  # the whole workload's: a fleet's replica grows
            # never evicting, unbounded needs 1 ghost, not 2 a block (the horizon stays its pool)
            ghost_factor=1 / num_blocks if sim.unbounded else 2.0,
            whole_run_reprefill=True,  # as the compiled radix loop counts (the trace bounds the keys)
        )
        manager.preemption_order = resolve_order(self.preemption_order)  # the scheduler's choice
        belady = None
        if manager.policy.offline:
            if not isinstance(manager.policy, BeladyPolicy):
                raise ValueError(
                    f"offline policy {manager.policy_name!r} has no future the radix model can give"
                )
            belady = RadixBelady(requests)
            manager.radix.set_policy(belady)
        manager.policy.stop_recording_evicted()  # the row's re-prefills are the manager's own
        if any_contract(sim.workload.requests):  # prompt-cache contracts: handed to the cache
            return ContractRadixModel(manager, belady)
        return RadixModel(manager, belady)

    def run_compiled(self, sim: Any, st: RunState) -> str | None:
        if isinstance(st.cache, ContractRadixModel):
            return CONTRACT_LOOP_REASON  # the compiled loop has no retention nor receipts
        return radix_run.compiled_run(sim, st, self)


@dataclass(frozen=True, slots=True)
class FlatCacheModel(CacheModelKind):
    """Independent blocks with forced admission: libCacheSim's model. No options: the running
    requests' memory is not modelled, so queue protection and compress-on-evict have nothing to
    act on (a flat row ignores them, as it always did)."""

    name: ClassVar[str] = "flat"
    holds_running: ClassVar[bool] = False

    def build(self, sim: ModelHost, requests: RunRequests) -> FlatModel:
        return FlatModel(sim.policy_spec, sim.capacity, requests)

    def run_compiled(self, sim: Any, st: RunState) -> str | None:
        return flat_run.compiled_run(sim, st)


@dataclass(frozen=True, slots=True)
class SGLangCacheModel(CacheModelKind):
    """SGLang's radix cache, queue order and retraction."""

    name: ClassVar[str] = "sglang"
    online_only: ClassVar[bool] = True
    queue_orders: ClassVar[bool] = True
    schedule_policy: str = "fcfs"

    @classmethod
    def from_options(cls, options: ModelOptions) -> SGLangCacheModel:
        if options.protect_queued > 0 or options.compress_on_evict is not None:
            raise ValueError("protect_queued and compress_on_evict are sage's radix model's, not SGLang's")
        if options.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(
                f"unknown schedule policy {options.schedule_policy!r}; the sglang model has: "
                f"{', '.join(SCHEDULE_POLICIES)}"
            )
        return cls(options.schedule_policy)

    def policy_name(self, spec: str) -> str:
        """SGLang's strategy, or ``sage-<spec>`` (checked when the model is built)."""
        return spec.split(":", 1)[0].strip().lower()

    def build(self, sim: ModelHost, requests: RunRequests) -> SGLangModel:
        return SGLangModel(sim.policy_spec, self.pool_blocks(sim), sim.block_size, self.schedule_policy)

    def run_compiled(self, sim: Any, st: RunState) -> str | None:
        return "SGLang's tree is modelled in Python"


class TwinCacheModel(CacheModelKind):
    """An engine twin (`model_names.TWINS`): its own scheduler, run by `twins.twin_runner`, not
    by `Simulator`; its traits, for the sweep's checks."""

    name: ClassVar[str] = "vllm"
    online_only: ClassVar[bool] = True
    reserved_blocks: ClassVar[int] = 1  # vLLM's pool gives one block to its null block

    def build(self, sim: ModelHost, requests: RunRequests) -> RunModel:
        raise ValueError(f"the {self.name} twin runs on its own (twins.twin_runner), not in Simulator")


class SageTwinCacheModel(TwinCacheModel):
    """sage's own engine's scheduler over its cache (`twins.sage_run`): the engine's admission,
    chunked prefill and preemption; its pool has no null block."""

    name: ClassVar[str] = "sage"
    reserved_blocks: ClassVar[int] = 0


_KINDS: dict[str, type[CacheModelKind]] = {
    kind.name: kind for kind in (RadixCacheModel, FlatCacheModel, SGLangCacheModel)
}
_TWIN_KINDS: dict[str, type[CacheModelKind]] = {
    kind.name: kind for kind in (TwinCacheModel, SageTwinCacheModel)
}
if tuple(_KINDS) != EVENT_LOOP_MODELS or tuple(_TWIN_KINDS) != tuple(TWINS):  # model_names' list
    raise ImportError(f"cache model kinds {tuple(_KINDS)}, {tuple(_TWIN_KINDS)} are not model_names'")


def model_traits(name: str) -> type[CacheModelKind]:
    """The class of cache model or twin `name`, for what its options and rows may be.

    Raises:
        ValueError: A name that is neither.
    """
    found = _KINDS.get(name) or _TWIN_KINDS.get(name)
    if found is None:
        names = (*EVENT_LOOP_MODELS, *TWINS)
        raise ValueError(f"unknown cache model {name!r}; cache models: {', '.join(names)}")
    return found


@dataclass(frozen=True, slots=True)
class ModelOptions:
    """The options `Simulator` takes for whichever model it runs (`Simulator`'s Args)."""

    protect_queued: float = 0.0
    adaptive_batch: bool = False
    compiled: bool | None = None
    tiers: TierConfig | None = None
    compress_on_evict: str | None = None
    schedule_policy: str = "fcfs"
    preemption_order: str = POLICY


def cache_model_for(name: str, **options: Any) -> CacheModelKind:
    """The cache model `name` with its options (the fields of `ModelOptions`), each model taking
    its own (`from_options`); an option another model's is refused.

    Raises:
        ValueError: An unknown model, or an option the model does not take.
    """
    kind = _KINDS.get(name)
    if kind is None:
        raise ValueError(f"unknown cache model {name!r}; cache models: {', '.join(_KINDS)}")
    given = ModelOptions(**options)
    if not 0.0 <= given.protect_queued <= 1.0:
        raise ValueError(f"protect_queued={given.protect_queued!r} must be within [0, 1]")
    if (given.adaptive_batch or (given.tiers is not None and given.tiers.enabled)) and not kind.radix_options:
        raise ValueError("adaptive batch and KV tiers need the radix cache model (the flat one: no tree)")
    if given.schedule_policy != "fcfs" and not kind.queue_orders:
        raise ValueError(f"schedule policy {given.schedule_policy!r} is SGLang's: needs the sglang model")
    resolve_order(given.preemption_order)  # an unknown name: its ValueError lists the known
    if given.preemption_order != POLICY and not kind.radix_options:
        raise ValueError(
            f"preemption order {given.preemption_order!r} is sage's scheduler's: needs the radix model"
        )
    return kind.from_options(given)
