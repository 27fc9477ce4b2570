"""An engine's parts built from its config: the model and its pool (loaded on the engine
thread), the pool's size, the cache manager, token-level eviction, and colocation's gates.

`Engine.__init__` builds its parts in the order each needs the ones before it: the model and
the pool, the event log and the cache manager, the metrics, token-level eviction, colocation's
gates (the controller over the pool), the scheduler's hooks, the scheduler, and last the
colocation loop that reads the scheduler's queues. The builders that take more than a line of
config live here.

Imports: the cache core, the model, token-level eviction, the colocation controller and this
package's config, colocation and engine thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.events import EvictionEventLog
from engine_adapter.cache.lookup_log import LookupLog
from engine_adapter.cache.retention import RetentionConfig
from engine_adapter.cache.tiers import TierConfig
from engine_adapter.colocation import ColocationController
from engine_adapter.model.config import ModelConfig
from engine_adapter.model.decoder import Decoder, ForwardBatch
from engine_adapter.model.disk_store import DiskKVStore
from engine_adapter.model.graphs import enable_cuda_graphs
from engine_adapter.model.host_pool import HostKVPool
from engine_adapter.model.kv_pool import PagedKVPool, resolve_dtype
from engine_adapter.model.loader import load_model
from engine_adapter.model.packed import warm_buckets
from engine_adapter.model.tokenizer import Tokenizer
from engine_adapter.serving.colocation import ColocationGates
from engine_adapter.serving.config import ConfigError, EngineConfig, colocation_params, colocation_switches
from engine_adapter.serving.config.values import check_device
from engine_adapter.serving.engine_thread import ThreadSettings, apply_threads, check_threads
from engine_adapter.serving.errors import RequestError
from engine_adapter.token_eviction.pressure import (
    CudaMonitor,
    LeastMonitor,
    PoolMonitor,
    ProcMeminfoMonitor,
    SystemMonitor,
    TokenCacheManager,
)
from engine_adapter.token_eviction.registry import token_policy_from_spec

__all__ = [
    "DEFAULT_NUM_BLOCKS",
    "KVTiers",
    "ModelParts",
    "cache_manager",
    "colocation_gates",
    "kv_tiers",
    "load_parts",
    "model_and_pool",
    "pool_blocks",
    "token_manager",
    "warm_up",
]

# The pool size when the config sets none: enough for sage-tiny on a CPU; pass --num-blocks,
# --kv-cache-memory or --gpu-memory-utilization for a real model.
DEFAULT_NUM_BLOCKS = 2048


@dataclass(frozen=True, slots=True)
class KVTiers:
    """The KV tiers under the device pool (issue 30; ``--host-kv-cache``, ``--disk-kv-cache``):
    None where a tier is off. The cache core is told their capacities in blocks."""

    host: HostKVPool | None = None
    disk: DiskKVStore | None = None

    @property
    def host_blocks(self) -> int:
        """Slots of the host tier; 0: off."""
        return 0 if self.host is None else self.host.num_blocks

    @property
    def disk_blocks(self) -> int:
        """Slots of the disk tier; 0: off."""
        return 0 if self.disk is None else self.disk.num_blocks


@dataclass(frozen=True, slots=True)
class ModelParts:
    """What the engine thread loads before the engine is built around it."""

    threads: ThreadSettings
    decoder: Decoder
    tokenizer: Tokenizer
    model_config: ModelConfig
    pool: PagedKVPool
    tiers: KVTiers


def load_parts(config: EngineConfig) -> ModelParts:
    """The engine thread's first job: its torch threads, the model, the KV pool and its tiers and
    a warm-up, in that order (the thread count must be set before the first parallel region; the
    tiers' tensors and CUDA stream belong to the thread that copies into them)."""
    threads = apply_threads(config.threads)
    decoder, tokenizer, model_config, pool = model_and_pool(config)
    tiers = kv_tiers(config, pool)
    warm_up(decoder, config.block_size, config.max_num_batched_tokens, config.max_num_seqs)
    return ModelParts(check_threads(threads), decoder, tokenizer, model_config, pool, tiers)


def kv_tiers(config: EngineConfig, pool: PagedKVPool) -> KVTiers:
    """The host pool and the disk store the config asks for, sized in blocks of `pool`.

    Raises:
        ConfigError: A tier's size holds no block, or the disk tier's folder is not usable.
    """
    if config.host_kv_cache is None:
        return KVTiers()
    host = HostKVPool.like(pool, _tier_blocks(config.host_kv_cache, pool, "host_kv_cache"))
    if not config.disk_kv_cache or config.disk_kv_size is None:
        return KVTiers(host)
    blocks = _tier_blocks(config.disk_kv_size, pool, "disk_kv_size")
    try:
        disk = DiskKVStore.like(pool, config.disk_kv_cache, blocks)
    except ValueError as exc:
        raise ConfigError(f"disk_kv_cache: {exc}") from None
    return KVTiers(host, disk)


def _tier_blocks(size: int, pool: PagedKVPool, key: str) -> int:
    """Blocks of `pool` in `size` bytes."""
    try:
        return PagedKVPool.blocks_for_memory(
            size,
            num_layers=pool.num_layers,
            num_kv_heads=pool.num_kv_heads,
            head_dim=pool.head_dim,
            block_size=pool.block_size,
            dtype=pool.dtype,
        )
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def warm_up(decoder: Decoder, block_size: int, max_rows: int = 1, max_seqs: int = 1) -> None:
    """One forward of one token through a one-block pool of its own, so that the OpenMP team
    and the kernels' first-call setup are the engine thread's before the first request; then
    every packed linear at every row bucket a step of at most `max_rows` rows (`max_seqs`
    sequences) can bring, so that no request builds a oneDNN primitive (`warm_buckets`)."""
    pool = decoder.make_pool(num_blocks=1, block_size=block_size)
    decoder(ForwardBatch([[0]], [0], [pool.allocator.allocate(1)]), pool)
    warm_buckets(decoder, max_rows, max_seqs)


def model_and_pool(config: EngineConfig) -> tuple[Decoder, Tokenizer, ModelConfig, PagedKVPool]:
    """The model in the config's dtype and quantization (compiled with ``compile``; decode steps
    from CUDA graphs with ``cuda_graphs`` on CUDA) and its KV pool in ``kv_dtype`` (auto: the
    model's dtype), sized by `pool_blocks`."""
    check_device(config.device)
    decoder, tokenizer, model_config = load_model(
        config.model,
        device=config.device,
        dtype=config.dtype,
        quantization=config.quantization,
        packed_weights=config.packed_weights,
        batch_invariant=config.batch_invariant,
        compile_step=config.compile,
    )
    kv_dtype = decoder.dtype if config.kv_dtype == "auto" else resolve_dtype(config.kv_dtype)
    pool = decoder.make_pool(
        num_blocks=pool_blocks(config, decoder, str(decoder.device), kv_dtype),
        block_size=config.block_size,
        kv_dtype=kv_dtype,
    )
    if config.compile:
        decoder.compile_step()
    if config.cuda_graphs and decoder.device.type == "cuda":
        # The eager math inside the graph, even with --compile: inductor's kernels captured there
        # won batch 1 (2.78 against 3.18 ms) but lost batch 64 (47.8 against 6.1 ms) on an H100
        # (docs/performance.md), so they stay an option of the graphs (compiled_math) for now.
        enable_cuda_graphs(decoder, pool, max_batch=config.max_num_seqs)
    return decoder, tokenizer, model_config, pool


def pool_blocks(config: EngineConfig, decoder: Any, device: str, kv_dtype: Any = None) -> int:
    """Blocks of the KV pool: ``num_blocks``, else what ``kv_cache_memory`` or
    ``gpu_memory_utilization`` holds for the model (K/V in `kv_dtype`, None: the model's),
    else `DEFAULT_NUM_BLOCKS`."""
    cfg = decoder.config
    shape = {
        "num_layers": cfg.num_hidden_layers,
        "num_kv_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "block_size": config.block_size,
        "dtype": decoder.dtype if kv_dtype is None else kv_dtype,
    }
    if config.num_blocks is not None:
        return config.num_blocks
    if config.kv_cache_memory is not None:
        return PagedKVPool.blocks_for_memory(config.kv_cache_memory, **shape)
    if config.gpu_memory_utilization is not None:
        return PagedKVPool.blocks_for_utilization(config.gpu_memory_utilization, device=device, **shape)
    return DEFAULT_NUM_BLOCKS


def cache_manager(
    config: EngineConfig, pool: PagedKVPool, events: EvictionEventLog, tiers: KVTiers | None = None
) -> CacheManager:
    """The cache manager over the pool's allocator, with the config's policy and limits, and the
    host/disk tiers' capacities and policies when `tiers` has them."""
    tier_config = None
    if tiers is not None and tiers.host_blocks:
        tier_config = TierConfig(
            host_blocks=tiers.host_blocks,
            disk_blocks=tiers.disk_blocks,
            host_policy=config.host_eviction_policy,
            host_policy_params=dict(config.host_policy_params),
            write_policy=config.host_write_policy,
            # the blocks queued requests' prefetches may count at once; each step fills only
            # spare free blocks (engine_adapter.serving.prefetch)
            prefetch_blocks=pool.num_blocks // 2 if config.prefetch else 0,
        )
    return CacheManager(
        pool.allocator,
        policy=config.eviction_policy,
        policy_params=dict(config.policy_params),
        max_pinned_ratio=config.max_pinned_ratio,
        eviction_threshold=config.eviction_threshold,
        event_log=events,
        protect_queued=config.protect_queued,
        explain=config.explain_evictions,
        tiers=tier_config,
        compress_on_evict=config.compress_on_evict or None,
        ghost_factor=config.ghost_factor,
        lookup_log=LookupLog(config.lookup_log) if config.lookup_log else None,
        retention=RetentionConfig(
            max_ttl_s=config.max_cache_ttl,
            max_retained_fraction=config.max_retained_fraction,
            cache_generated=config.cache_generated_tokens,
        ),
    )


def token_manager(
    config: EngineConfig, cache: CacheManager, pool: PagedKVPool, events: EvictionEventLog
) -> TokenCacheManager:
    """Token-level eviction (spec 002): the policy, and pressure from the least of the pool's
    available blocks and the device's memory."""
    monitors: list[SystemMonitor] = [
        PoolMonitor(lambda: cache.num_available_blocks, cache.num_blocks, pool.bytes_per_block)
    ]
    if pool.device.type == "cuda":
        monitors.append(CudaMonitor(pool.device))
    elif pool.device.type == "cpu":
        monitors.append(ProcMeminfoMonitor())
    return TokenCacheManager(
        token_policy_from_spec(config.token_eviction, window=config.eviction_window),
        LeastMonitor(*monitors),
        config.memory_threshold * 1024 * 1024,
        config.token_target_ratio,
        window=config.eviction_window,
        events=events,
    )


def colocation_gates(
    config: EngineConfig, cache: CacheManager, clock: Callable[[], float]
) -> ColocationGates | None:
    """Spec 004's controller over the pool, as the scheduler's gates; None when colocation is off.

    Raises:
        RequestError: A colocation param the controller refuses.
        ValueError: A colocation switch that is not a boolean.
    """
    if config.colocation == "off":
        return None
    try:
        params, system = colocation_params(config.colocation_params)
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    controller = ColocationController(
        cache.num_blocks, cache.block_size, params, config.colocation, system=system
    )
    switches = colocation_switches(config.colocation_params)
    return ColocationGates(controller, cache, clock, slo_preemption=switches["slo_preemption"])
