"""The decode step of a 1B-class Llama on one GPU: sage's paged decoder eager, as one CUDA graph
per step (engine_adapter.model.graphs) and compiled, against transformers' LlamaForCausalLM on
the same GPU and shapes.

The model has TinyLlama-1.1B's shape (hidden 2048, 22 layers, 32 heads, 4 KV heads, MLP 5632,
vocab 32000) with random bf16 weights: nothing is downloaded, and a step's time does not depend
on the values. Each of B sequences holds `--context` tokens in a paged pool on the device; a
step decodes one token per sequence (the Python that builds the step's index tensors included,
as in the engine) and is timed with CUDA events, median of `--iters` after `--warmup`. The CUDA
graph row captures its bucket in the first warm-up step; on the CPU it runs the same padded
static step eagerly (no graph). Before it, one step's logits of the graph and of the eager
forward are compared (printed: the largest difference).
transformers runs the same batch after a prefill of the same length: sdpa attention, a static
cache when this transformers has one (else its dynamic cache).

Imports torch, transformers and sage's model package only (not the serving layer), so it runs on
a machine with a bare CUDA torch.

    python benchmarks/gpu_decode.py                        # cuda, batch 1 and 64, context 512
    python benchmarks/gpu_decode.py --device cpu --tiny    # a small model on the CPU (a check)
    python benchmarks/gpu_decode.py --no-compile --no-transformers   # eager and graph rows only
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from engine_adapter.model.config import ModelConfig
from engine_adapter.model.decoder import Decoder, ForwardBatch
from engine_adapter.model.graphs import enable_cuda_graphs
from engine_adapter.model.kv_pool import PagedKVPool

TINYLLAMA = ModelConfig(
    architecture="llama",
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=64,
    rms_norm_eps=1e-5,
    max_position_embeddings=2048,
)
TINY = ModelConfig(
    architecture="llama",
    vocab_size=1024,
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=2048,
)
BLOCK_SIZE = 16


def _timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """A function timing one call in seconds: CUDA events on a GPU, perf_counter on the CPU."""

    def cuda(fn: Callable[[], object]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def cpu(fn: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return cuda if device.type == "cuda" else cpu


def sage_decoder(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> Decoder:
    """The sage decoder of `config` with random weights (std 0.02, norms 1) on `device`."""
    with torch.device("meta"):
        decoder = Decoder(config)
    decoder = decoder.to_empty(device=device).to(dtype=dtype)
    decoder.tie_weights()
    with torch.no_grad():
        for name, param in decoder.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02)
    return decoder.eval().requires_grad_(False)


def time_sage(
    decoder: Decoder,
    batch: int,
    args: argparse.Namespace,
    timer: Callable[..., float],
    graphs: bool = False,
    compiled_math: bool = False,
) -> float:
    """Median seconds of one decode step of `batch` sequences that each hold `args.context` tokens
    (with `graphs`: replayed from the step's CUDA graph, with inductor's kernels for the dense
    math inside it when `compiled_math`)."""
    steps = args.warmup + args.iters
    pool, tables = _filled_pool(decoder, batch, args.context + steps + 1)
    decoder.graphs = None
    if graphs:
        enable_cuda_graphs(decoder, pool, compiled_math=compiled_math, max_batch=max(batch, 1))
    tokens = torch.randint(0, decoder.config.vocab_size, (batch,)).tolist()
    times = []
    for i in range(steps):
        fb = ForwardBatch([[t] for t in tokens], [args.context + i] * batch, tables)
        times.append(timer(lambda fb=fb: decoder(fb, pool)))
    decoder.graphs = None
    return statistics.median(times[args.warmup :])


def _filled_pool(decoder: Decoder, batch: int, tokens: int) -> tuple[PagedKVPool, list[list[int]]]:
    """A pool of random K/V (values do not change the time) with `batch` tables of `tokens`."""
    per_seq = -(-tokens // BLOCK_SIZE)
    pool = decoder.make_pool(num_blocks=batch * per_seq, block_size=BLOCK_SIZE)
    for cache in (*pool.k_cache, *pool.v_cache):
        cache.normal_(0.0, 1.0)
    return pool, [pool.allocator.allocate(per_seq) for _ in range(batch)]


def graph_check(decoder: Decoder, batch: int, context: int) -> float:
    """The largest difference between one decode step's logits from the graph (a padded bucket
    when `batch` is not a power of two) and from the eager forward (the same K/V rewritten)."""
    pool, tables = _filled_pool(decoder, batch, context + 1)
    contexts = [context - 7 * i for i in range(batch)]  # ragged
    tokens = torch.randint(0, decoder.config.vocab_size, (batch,)).tolist()
    fb = ForwardBatch([[t] for t in tokens], contexts, tables)
    decoder.graphs = None
    eager = decoder(fb, pool).logits
    enable_cuda_graphs(decoder, pool)
    graph = decoder(fb, pool).logits
    decoder.graphs = None
    return float((graph - eager).abs().max())


def time_transformers(
    config: ModelConfig,
    batch: int,
    args: argparse.Namespace,
    device: torch.device,
    timer: Callable[..., float],
) -> tuple[float, str]:
    """Median seconds of one decode step of LlamaForCausalLM after a prefill of `args.context`."""
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_config = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        attn_implementation="sdpa",
    )
    with torch.device(device):
        model = LlamaForCausalLM(hf_config).to(args.torch_dtype).eval()
    steps = args.warmup + args.iters
    cache, kind = _hf_cache(
        transformers, hf_config, batch, args.context + steps + 1, device, args.torch_dtype
    )
    ids = torch.randint(0, config.vocab_size, (batch, args.context), device=device)
    with torch.inference_mode():
        out = model(
            input_ids=ids,
            past_key_values=cache,
            use_cache=True,
            cache_position=torch.arange(args.context, device=device),
        )
        cache = out.past_key_values
        next_ids = out.logits[:, -1].argmax(-1, keepdim=True)
        times = []
        for i in range(steps):
            position = torch.tensor([args.context + i], device=device)

            def step(position: torch.Tensor = position) -> object:
                return model(
                    input_ids=next_ids, past_key_values=cache, use_cache=True, cache_position=position
                )

            times.append(timer(step))
    return statistics.median(times[args.warmup :]), kind


def _hf_cache(
    transformers: object, hf_config: object, batch: int, length: int, device: torch.device, dtype: torch.dtype
) -> tuple[object, str]:
    static = getattr(transformers, "StaticCache", None)
    if static is not None:
        try:
            return static(
                config=hf_config, max_batch_size=batch, max_cache_len=length, device=device, dtype=dtype
            ), "static"
        except TypeError:
            try:
                return static(config=hf_config, max_cache_len=length), "static"
            except TypeError:
                pass
    return transformers.DynamicCache(), "dynamic"  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a small model (for a CPU check)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-sizes", default="1,64")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-graphs", action="store_true", help="no CUDA graph row")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument(
        "--profile", action="store_true", help="print torch.profiler tables of the eager step"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    args.torch_dtype = getattr(torch, args.dtype)
    config = TINY if args.tiny else TINYLLAMA
    timer = _timer(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"# {machine_line()}; device {name}; torch {torch.__version__}; threads {torch.get_num_threads()}")
    print(
        f"# model {'tiny' if args.tiny else 'TinyLlama-1.1B shape'}, {args.dtype}, context {args.context}, "
        f"median of {args.iters} steps after {args.warmup}"
    )
    batches = [int(b) for b in args.batch_sizes.split(",")]
    print(f"\n| {'decode step, ms':<48} | " + " | ".join(f"batch {b:>3}" for b in batches) + " |")
    print(f"|{'-' * 50}|" + "|".join("-" * 11 for _ in batches) + "|", flush=True)

    def row(label: str, times: dict[int, float]) -> None:
        print(f"| {label:<48} | " + " | ".join(f"{times[b] * 1e3:9.2f}" for b in batches) + " |", flush=True)

    decoder = sage_decoder(config, device, args.torch_dtype)
    row("sage eager", {b: time_sage(decoder, b, args, timer) for b in batches})
    if not args.no_graphs:
        _graph_row(decoder, batches, args, timer, row)
    if args.profile:
        _profile(decoder, batches[0], args, timer)
    if not args.no_transformers:
        _transformers_row(config, batches, args, device, timer, row)
    if not args.no_compile:
        t0 = time.perf_counter()
        try:
            mode = decoder.compile_step()
            row(f"sage compiled ({mode})", {b: time_sage(decoder, b, args, timer) for b in batches})
        except Exception as exc:  # a failed compile still leaves the other rows
            print(f"# compile failed: {type(exc).__name__}: {str(exc)[:300]}")
        print(f"# compile and its timed runs took {time.perf_counter() - t0:.0f} s")


def _graph_row(
    decoder: Decoder,
    batches: list[int],
    args: argparse.Namespace,
    timer: Callable[..., float],
    row: Callable[[str, dict[int, float]], None],
) -> None:
    t0 = time.perf_counter()
    diff = graph_check(decoder, 5, args.context)
    print(f"# graph vs eager, batch 5 (bucket 8), ragged contexts: max |logits diff| {diff:.3g}")
    label = (
        "sage CUDA graph (whole step)"
        if decoder.device.type == "cuda"
        else "sage static step (CPU: no graph)"
    )
    row(label, {b: time_sage(decoder, b, args, timer, graphs=True) for b in batches})
    if not args.no_compile:  # inductor's fused kernels captured inside the step's graph
        row(label + " + compiled math", {
            b: time_sage(decoder, b, args, timer, graphs=True, compiled_math=True) for b in batches
        })
    print(f"# the graph rows (captures and compiles included) took {time.perf_counter() - t0:.0f} s")


def _profile(decoder: Decoder, batch: int, args: argparse.Namespace, timer: Callable[..., float]) -> None:
    """The operators of sage's eager decode step at `batch`, by self CPU time and by device time."""
    from torch.profiler import ProfilerActivity, profile

    short = argparse.Namespace(**{**vars(args), "warmup": 3, "iters": 10})
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        time_sage(decoder, batch, short, timer)
    table = prof.key_averages()
    print(f"\n# profile of 13 eager steps at batch {batch}, by self CPU time")
    print(table.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=40))
    if torch.cuda.is_available():
        print(table.table(sort_by="self_cuda_time_total", row_limit=10, max_name_column_width=40))


def _transformers_row(
    config: ModelConfig,
    batches: list[int],
    args: argparse.Namespace,
    device: torch.device,
    timer: Callable[..., float],
    row: Callable[[str, dict[int, float]], None],
) -> None:
    try:
        import transformers
    except ImportError:
        print("# transformers is not installed: no peer row")
        return
    results = {b: time_transformers(config, b, args, device, timer) for b in batches}
    kind = next(iter(results.values()))[1]
    row(
        f"transformers {transformers.__version__} (sdpa, {kind} cache)", {b: r[0] for b, r in results.items()}
    )
    if device.type == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
