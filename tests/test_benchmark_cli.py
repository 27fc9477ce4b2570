"""``sage llm benchmark --mode sim`` as a real process: the table, the JSON file, the errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # `sage llm benchmark` as real processes: out of the quick loop

ROW_KEYS = [
    "policy",
    "capacity_blocks",
    "cache_model",
    "requests",
    "block_lookups",
    "block_hits",
    "hit_rate",
    "re_prefill_rate",
    "fairness_score",
    "memory_utilization",
    "evictions",
    "eviction_p50_us",
    "eviction_p99_us",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "throughput_tok_s",
    "throughput_impact",
    "preemptions",
    "wall_s",
    "lookups_per_s",
    "adaptive_batch",
    "batch_changes",
    "host_policy",
    "host_capacity_blocks",
    "disk_capacity_blocks",
    "device_hit_ratio",
    "host_hit_ratio",
    "disk_hit_ratio",
    "load_s",
    "recompute_s",
    "prefetch_hits",
    "regrets",
    "ghost_hits",
    "regret_ratio",
    "age_histograms",
    "policy_calls",
    "event_loop",
]


def sage(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "SAGE_HOME": str(cwd / "sage-home")}
    env.pop("SAGE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "sage_cli", "llm", "benchmark", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "internal error" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def mooncake_trace(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


SMALL = [
    {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]},
    {"timestamp": 10, "input_length": 1536, "output_length": 2, "hash_ids": [1, 2, 3]},
    {"timestamp": 20, "input_length": 512, "output_length": 3, "hash_ids": [4]},
    {"timestamp": 30, "input_length": 1024, "output_length": 2, "hash_ids": [1, 5]},
]


def test_synthetic_run_prints_the_table_and_writes_the_json(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = sage(
        "--workload",
        "synthetic",
        "--requests",
        "80",
        "--eviction-policies",
        "lru,arc",
        "--capacity-ratio",
        "0.2,0.5",
        "--output",
        str(out),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "lru" in proc.stdout and "arc" in proc.stdout and "belady" in proc.stdout
    assert "unbound" in proc.stdout  # the column may be cut to "unbound…"
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["workload"]["source"] == "synthetic"
    assert result["workload"]["requests"] == 80
    rows = result["results"]
    assert [list(row) for row in rows] == [ROW_KEYS] * len(rows)
    capacities = result["settings"]["capacities"]
    assert len(capacities) == 2
    expected = {(p, c) for c in capacities for p in ("lru", "arc", "belady")}
    expected.add(("unbounded", result["workload"]["unique_blocks"]))
    assert {(row["policy"], row["capacity_blocks"]) for row in rows} == expected
    for row in rows:
        assert row["requests"] == 80
        assert 0.0 <= row["hit_rate"] <= 1.0
        assert row["block_lookups"] == result["workload"]["total_block_lookups"] or row["preemptions"] > 0


def test_the_table_shows_preemptions_and_warns_when_the_engine_saturates(tmp_path: Path) -> None:
    """Issue 28, item 10: at a small cache every row preempts, Belady's included, and a cost
    model too slow for the workload makes TTFT a queue; the table says both."""
    costs = tmp_path / "slow.yaml"
    costs.write_text("prefill_per_token_s: 0.01\ndecode_base_s: 0.2\n", encoding="utf-8")
    proc = sage(
        "--workload", "synthetic", "--requests", "120", "--eviction-policies", "lru", "--jobs", "1",
        "--cost-model", str(costs), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    header = next(line for line in proc.stdout.splitlines() if "Policy" in line)
    assert "Preempted" in header and "TTFT p50 s" in header
    assert "…" not in proc.stdout  # a pipe gets the table's full width, not 80 columns
    warning = [line for line in proc.stdout.splitlines() if line.startswith("warning: saturated")]
    assert warning and "overloads the modelled engine" in warning[0]
    result = json.loads(sage(
        "--workload", "synthetic", "--requests", "120", "--eviction-policies", "lru", "--jobs", "1",
        "--cost-model", str(costs), "--json", cwd=tmp_path,
    ).stdout)  # fmt: skip
    assert result["saturation"]["reference_saturated"] is True
    assert result["saturation"]["warnings"][0] in " ".join(proc.stdout.split())


def test_percent_ratios_and_specs_with_params_label_their_rows(tmp_path: Path) -> None:
    """Issue 48, items 3 and 11: ``--capacity-ratio 5%`` is 0.05 (as ``--load 125%`` is 1.25),
    and a policy spec with params keeps them in its row's label, in the table and the JSON."""
    args = ["--workload", "synthetic", "--requests", "80", "--cache-model", "flat", "--jobs", "1"]
    args += ["--eviction-policies", "slru,slru:protected_ratio=0.1"]
    by_percent = sage(*args, "--capacity-ratio", "20%,50%", "--json", cwd=tmp_path)
    by_fraction = sage(*args, "--capacity-ratio", "0.2,0.5", "--json", cwd=tmp_path)
    assert by_percent.returncode == 0, by_percent.stderr
    percent, fraction = json.loads(by_percent.stdout), json.loads(by_fraction.stdout)
    assert percent["settings"]["capacities"] == fraction["settings"]["capacities"]
    labels = [row["policy"] for row in percent["results"]]
    assert labels[:2] == ["slru", "slru:protected_ratio=0.1"]
    table = sage(*args, "--capacity-ratio", "20%", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert any(line.split()[:1] == ["slru:protected_ratio=0.1"] for line in table.stdout.splitlines())
    assert "cost model: llama-7b-fp16 on A100-80GB" in table.stdout  # what the TTFTs come from
    assert_one_line_error(sage(*args, "--capacity-ratio", "150%", cwd=tmp_path), "150%", "percentage")


@pytest.mark.parametrize("policies", ["", " ", ",", " , "])
def test_an_empty_policy_list_is_a_one_line_error(tmp_path: Path, policies: str) -> None:
    """Issue 28, item 15: an empty --eviction-policies is refused, not read as the default."""
    proc = sage("--workload", "synthetic", "--requests", "10", "--eviction-policies", policies, cwd=tmp_path)
    assert_one_line_error(proc, "--eviction-policies is empty", "lru")
    assert proc.returncode == 2 and proc.stdout == ""


def test_trace_run_with_capacity_blocks_and_json_output(tmp_path: Path) -> None:
    trace = mooncake_trace(tmp_path / "t.jsonl", SMALL)
    proc = sage(
        "--trace",
        str(trace),
        "--eviction-policies",
        "lru",
        "--capacity-blocks",
        "3",
        "--cache-model",
        "flat",
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    lru = next(row for row in result["results"] if row["policy"] == "lru")
    assert (lru["block_lookups"], lru["capacity_blocks"], lru["cache_model"]) == (8, 3, "flat")


def test_unknown_policy_is_a_one_line_error(tmp_path: Path) -> None:
    proc = sage(
        "--workload", "synthetic", "--requests", "10", "--eviction-policies", "lru,nosuch", cwd=tmp_path
    )
    assert_one_line_error(proc, "nosuch", "lru")


def test_capacity_beyond_the_trace_is_a_one_line_error(tmp_path: Path) -> None:
    trace = mooncake_trace(tmp_path / "t.jsonl", SMALL)
    proc = sage("--trace", str(trace), "--capacity-blocks", "50", "--cache-model", "flat", cwd=tmp_path)
    assert_one_line_error(proc, "50", "5 distinct blocks")


def test_unreadable_trace_is_a_one_line_error(tmp_path: Path) -> None:
    proc = sage("--trace", str(tmp_path / "missing.jsonl"), cwd=tmp_path)
    assert_one_line_error(proc, "missing.jsonl")
    folder = tmp_path / "dir.jsonl"
    folder.mkdir()
    assert_one_line_error(sage("--trace", str(folder), cwd=tmp_path), "dir.jsonl")


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("{not json", "bad JSON"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1}', "hash_ids"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ' + "[" * 100_000, "nested"),
    ],
    ids=["bad-json", "missing-field", "deep-line", "deep-hash-ids"],
)
def test_malformed_trace_line_is_a_one_line_error(tmp_path: Path, line: str, what: str) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(json.dumps(SMALL[0]) + "\n" + line + "\n", encoding="utf-8")
    proc = sage("--trace", str(trace), "--trace-format", "mooncake", cwd=tmp_path)
    assert_one_line_error(proc, "bad.jsonl:2", what)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra")
    png = tmp_path / "hit_rate.png"
    proc = sage(
        "--workload", "synthetic", "--requests", "60", "--eviction-policies", "lru",
        "--capacity-ratio", "0.2,0.5", "--cache-model", "flat", "--plot", str(png), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--engine-kind", "vllm", "--engine-url", "http://127.0.0.1:1"], ["--mode engine"]),
        (["--mode", "engine", "--engine-kind", "vllm"], ["needs --engine-url"]),
        (["--mode", "engine", "--worker-url", "http://127.0.0.1:1"], ["give the router's --engine-url"]),
        (["--worker-url", "http://127.0.0.1:1"], ["--mode engine"]),
        (
            ["--mode", "engine", "--engine-url", "http://127.0.0.1:1", "--worker-url", "127.0.0.1:2"],
            ["--worker-url '127.0.0.1:2'", "http://"],
        ),
        (
            [
                *("--mode", "engine", "--engine-url", "http://127.0.0.1:1"),
                *("--worker-url", "http://127.0.0.1:2", "--worker-url", "http://127.0.0.1:2"),
            ],
            ["each engine once"],
        ),
        (
            ["--mode", "engine", "--engine-url", "http://127.0.0.1:1", "--capacity-blocks", "8"],
            ["--num-blocks"],
        ),
        (["--mode", "engine", "--engine-kind", "vllm", "--engine-url", "127.0.0.1:1"], ["http://"]),
        (
            [
                "--mode",
                "engine",
                "--engine-kind",
                "vllm",
                "--engine-url",
                "http://127.0.0.1:1",
                "--eviction-policies",
                "lru,lfu",
            ],
            ["one eviction policy per server start", "SAGE_VLLM_GPU_POLICY"],
        ),
        (
            [
                "--mode",
                "engine",
                "--engine-kind",
                "vllm",
                "--engine-url",
                "http://127.0.0.1:1",
                "--capacity-blocks",
                "8",
            ],
            ["--num-gpu-blocks-override"],
        ),
        (
            [
                "--mode",
                "engine",
                "--engine-kind",
                "vllm",
                "--engine-url",
                "http://127.0.0.1:1",
                "--eviction-policies",
                "nosuch",
            ],
            ["unknown eviction policy 'nosuch'"],
        ),
    ],
)
def test_a_bad_remote_target_is_a_one_line_error(
    tmp_path: Path, args: list[str], fragments: list[str]
) -> None:
    proc = sage(*args, "--requests", "2", cwd=tmp_path)
    assert_one_line_error(proc, *fragments)
    assert proc.returncode == 2


def test_a_sage_engine_url_that_does_not_answer_is_a_one_line_error(tmp_path: Path) -> None:
    proc = sage("--mode", "engine", "--engine-url", "http://127.0.0.1:1", "--requests", "2", cwd=tmp_path)
    assert_one_line_error(proc, "cannot reach the sage engine at http://127.0.0.1:1")
    assert proc.returncode == 1
