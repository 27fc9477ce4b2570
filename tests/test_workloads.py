"""Workload sources: the real traces' golden counts, the fixtures, the generators, the error messages."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from engine_adapter.sim.azure_trace import read_azure
from engine_adapter.sim.mooncake_trace import MOONCAKE_BLOCK_SIZE, read_mooncake
from engine_adapter.sim.prefix_model import PrefixModel
from engine_adapter.sim.shipped_traces import shipped_trace
from engine_adapter.sim.sources import load
from engine_adapter.sim.synthetic import preset, spec_benchmark, synthetic
from engine_adapter.sim.workloads import (
    SimRequest,
    Workload,
    WorkloadError,
    total_block_lookups,
    unique_blocks,
)

DATA = Path(__file__).parent / "data"


# The public traces sage ships (engine_adapter/sim/traces/, gzipped), by name: no folder to find.
MOONCAKE_TRACES = {
    "conversation_trace.jsonl": "mooncake:conversation",
    "synthetic_trace.jsonl": "mooncake:synthetic",
}
AZURE_TRACES = {
    "AzureLLMInferenceTrace_code.csv": "azure:code",
    "AzureLLMInferenceTrace_conv.csv": "azure:conversation",
}


def _shipped(name: str) -> Path:
    return shipped_trace(name)[0]


def _sorted(workload: Workload) -> bool:
    arrivals = [r.arrival_s for r in workload]
    return arrivals == sorted(arrivals)


# --------------------------------------------------------------------------- real traces


@pytest.mark.parametrize(
    ("name", "requests", "lookups", "unique"),
    [
        ("conversation_trace.jsonl", 12_031, 288_500, 182_790),
        ("synthetic_trace.jsonl", 3_993, 121_877, 43_924),
    ],
)
def test_mooncake_traces_have_the_published_counts(
    name: str, requests: int, lookups: int, unique: int
) -> None:
    workload = read_mooncake(_shipped(MOONCAKE_TRACES[name]))
    assert len(workload) == requests
    assert total_block_lookups(workload) == lookups
    assert unique_blocks(workload) == unique
    assert workload.block_size == MOONCAKE_BLOCK_SIZE
    assert _sorted(workload)
    first = workload.requests[0]
    assert first.arrival_s == 0.0 and first.tenant is None and first.priority == 0 and first.session is None
    assert all(len(r.block_hashes) == math.ceil(r.input_len / 512) for r in workload)
    described = workload.describe()
    assert described["source"] == "mooncake"
    assert (described["requests"], described["total_block_lookups"], described["unique_blocks"]) == (
        requests,
        lookups,
        unique,
    )
    json.dumps({"workload": described})


def test_mooncake_limit_reads_the_first_records() -> None:
    workload = read_mooncake(_shipped("mooncake:conversation"), limit=100)
    assert [r.request_id for r in workload] == list(range(100))
    assert workload.describe()["params"] == {"limit": 100}


@pytest.mark.parametrize(
    ("name", "rows"),
    [("AzureLLMInferenceTrace_code.csv", 8_819), ("AzureLLMInferenceTrace_conv.csv", 19_366)],
)
def test_azure_traces_parse_and_the_prefix_model_is_deterministic(name: str, rows: int) -> None:
    model = PrefixModel(seed=3, tenants=2, priority_weights=(1, 1))
    path = _shipped(AZURE_TRACES[name])
    first = read_azure(path, prefix_model=model)
    again = read_azure(path, prefix_model=PrefixModel(seed=3, tenants=2, priority_weights=(1, 1)))
    other = read_azure(path, prefix_model=PrefixModel(seed=4, tenants=2, priority_weights=(1, 1)))
    assert len(first) == rows
    assert first.requests == again.requests
    assert [r.block_hashes for r in first] != [r.block_hashes for r in other]
    assert [(r.arrival_s, r.input_len, r.output_len) for r in first] == [
        (r.arrival_s, r.input_len, r.output_len) for r in other
    ]
    assert _sorted(first)
    assert first.requests[0].arrival_s == 0.0
    assert 3000 < first.requests[-1].arrival_s < 3600  # the traces span just under an hour
    assert all(len(r.block_hashes) == r.input_len // model.block_size for r in first)
    # there is reuse to be had: shared system prompts and later turns
    assert unique_blocks(first) < 0.9 * total_block_lookups(first)
    assert {r.tenant for r in first} == {"t0", "t1"}
    assert {r.priority for r in first} == {0, 1}


# --------------------------------------------------------------------------- fixtures


def test_mooncake_fixture_optional_fields_and_ordering() -> None:
    workload = read_mooncake(DATA / "mooncake_small.jsonl")
    assert [r.request_id for r in workload] == [0, 1, 3, 2]  # stable sort by arrival; blank line skipped
    a, b, d, c = workload.requests
    assert a == SimRequest(0, 0.0, (0, 1, 2), 1200, 10, tenant="a", priority=2, session="chat-1")
    assert b.tenant == "7" and b.session is None and b.priority == 0
    assert d.block_hashes == () and d.arrival_s == 1.0
    assert c.arrival_s == pytest.approx(1.5005)
    assert unique_blocks(workload) == 5 and total_block_lookups(workload) == 9
    assert workload.describe()["tenants"] == 2 and workload.describe()["sessions"] == 1


def test_azure_fixture_times_across_midnight() -> None:
    workload = read_azure(
        DATA / "azure_small.csv", prefix_model=PrefixModel(block_size=16, sessions=1, turns=100)
    )
    assert [r.request_id for r in workload] == [0, 3, 1, 2]
    assert [r.arrival_s for r in workload] == pytest.approx([0.0, 0.4, 0.75, 0.75])
    assert [r.input_len for r in workload] == [100, 64, 40, 33]
    assert [r.output_len for r in workload] == [10, 1, 3, 7]
    # one conversation slot: every request is a later turn of the first, reusing its blocks
    first = workload.requests[0]
    assert len({r.session for r in workload}) == 1
    for request in workload.requests[1:]:
        assert request.block_hashes == first.block_hashes[: len(request.block_hashes)]


# --------------------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic_per_seed() -> None:
    assert synthetic(requests=300, seed=5).requests == synthetic(requests=300, seed=5).requests
    assert synthetic(requests=300, seed=5).requests != synthetic(requests=300, seed=6).requests


def test_synthetic_changing_the_rate_keeps_the_prefixes() -> None:
    slow, fast = synthetic(requests=300, rate=1.0), synthetic(requests=300, rate=50.0)
    assert [r.block_hashes for r in slow] == [r.block_hashes for r in fast]
    assert slow.requests[-1].arrival_s > 10 * fast.requests[-1].arrival_s


def test_synthetic_honours_tenants_and_priorities() -> None:
    workload = synthetic(requests=3000, tenants=5, priority_weights=(0.5, 0.3, 0.2), seed=1)
    assert {r.tenant for r in workload} == {f"t{i}" for i in range(5)}
    counts = Counter(r.priority for r in workload)
    assert set(counts) == {0, 1, 2}
    assert counts[0] > counts[2]
    described = workload.describe()
    assert described["tenants"] == 5 and described["requests"] == 3000
    assert described["params"]["priority_weights"] == [0.5, 0.3, 0.2]
    json.dumps(described)


@pytest.mark.parametrize("arrival", ["poisson", "periodic", "bursty"])
def test_synthetic_arrival_rate(arrival: str) -> None:
    workload = synthetic(requests=20_000, rate=25.0, arrival=arrival, seed=2)
    arrivals = np.array([r.arrival_s for r in workload])
    rate = (len(arrivals) - 1) / arrivals[-1]
    tolerance = 0.15 if arrival == "bursty" else 0.05
    assert rate == pytest.approx(25.0, rel=tolerance)
    cv = np.std(np.diff(arrivals)) / np.mean(np.diff(arrivals))
    expected_cv = {"poisson": 1.0, "periodic": 0.0, "bursty": 4.0}[arrival]
    assert cv == pytest.approx(expected_cv, abs=0.1 if arrival != "bursty" else 1.0)


def test_synthetic_duration_bounds_the_arrivals() -> None:
    workload = synthetic(requests=None, duration=30.0, rate=20.0, seed=3)
    arrivals = [r.arrival_s for r in workload]
    assert max(arrivals) < 30.0
    assert len(arrivals) == pytest.approx(600, rel=0.15)
    capped = synthetic(requests=10, duration=1000.0, rate=20.0)
    assert len(capped) == 10


def test_synthetic_sessions_extend_their_prefixes() -> None:
    workload = synthetic(requests=2000, sessions=16, turns=6.0, seed=4, block_size=16)
    by_session: dict[str | None, list[SimRequest]] = {}
    for request in workload:
        by_session.setdefault(request.session, []).append(request)
    multi_turn = [turns for turns in by_session.values() if len(turns) > 1]
    assert len(multi_turn) > 50
    for turns in multi_turn:
        for previous, current in itertools.pairwise(turns):
            assert current.input_len >= previous.input_len + previous.output_len
            assert current.block_hashes[: len(previous.block_hashes)] == previous.block_hashes
            assert len(current.block_hashes) == current.input_len // 16
            assert (current.tenant, current.priority) == (previous.tenant, previous.priority)


def test_synthetic_shared_system_prompts() -> None:
    workload = synthetic(requests=500, system_prompts=2, system_prompt_tokens=256, p_system=1.0, turns=1.0)
    heads = Counter(r.block_hashes[:16] for r in workload)
    assert len(heads) == 2 and sum(heads.values()) == 500
    none = synthetic(requests=500, p_system=0.0, turns=1.0)
    assert unique_blocks(none) == total_block_lookups(none)


def test_synthetic_respects_max_input_tokens() -> None:
    workload = synthetic(requests=2000, sessions=2, turns=1000.0, max_input_tokens=4096)
    assert max(r.input_len for r in workload) <= 4096
    assert len({r.session for r in workload}) > 2  # conversations restarted at the cap


# --------------------------------------------------------------------------- spec preset


def test_spec_preset_is_the_module_spec_scenario() -> None:
    workload = preset("spec", seed=0)
    sequences: dict[str | None, SimRequest] = {}
    accesses = Counter(r.session for r in workload)
    for request in workload:
        sequences.setdefault(request.session, request)
    assert len(sequences) == 1000
    for name, request in sequences.items():
        i = int(str(name).removeprefix("seq"))
        assert request.block_hashes == tuple(range(i * 10, (i + 1) * 10))
    assert set(accesses.values()) == set(range(1, 11))
    assert {r.priority for r in workload} == {0, 1, 2}
    assert len(workload) == sum(accesses.values())
    assert unique_blocks(workload) == 10_000
    assert all(0 <= r.arrival_s < 60.0 for r in workload) and _sorted(workload)
    assert workload.requests == preset("spec", seed=0).requests
    assert workload.requests != preset("spec", seed=1).requests
    assert preset("spec", tenants=4).describe()["tenants"] == 4
    assert spec_benchmark(sequences=10).describe()["unique_blocks"] == 100


# --------------------------------------------------------------------------- load by name


def test_load_by_name() -> None:
    assert load(str(DATA / "mooncake_small.jsonl")).source == "mooncake"
    assert (
        load("azure", path=DATA / "azure_small.csv", seed=2, sessions=3).params["prefix_model"]["seed"] == 2
    )
    assert len(load("synthetic", requests=10)) == 10
    assert load("spec", seed=1).source == "spec"


def test_load_converts_cli_strings() -> None:
    workload = load(
        "synthetic", requests="50", rate="2.5", duration="none", priority_weights="1/1/2", tenants="3"
    )
    assert len(workload) == 50
    assert workload.params["rate"] == 2.5 and workload.params["duration"] is None
    assert workload.params["priority_weights"] == [1.0, 1.0, 2.0] and workload.params["tenants"] == 3
    assert len(load("mooncake", path=DATA / "mooncake_small.jsonl", limit="2")) == 2
    azure = load(str(DATA / "azure_small.csv"), session_skew="0", limit="none")
    assert azure.params["prefix_model"]["session_skew"] == 0.0
    assert load("spec", sequences="5").params["sequences"] == 5
    with pytest.raises(WorkloadError, match=r"synthetic: param rate='fast' is not a valid float"):
        load("synthetic", rate="fast")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: load("nope"), "unknown workload source 'nope'"),
        (lambda: load("mooncake"), "needs a trace file path"),
        (lambda: load("synthetic", requsts=5), "takes no param(s) requsts"),
        (lambda: load("azure", path=DATA / "azure_small.csv", sesions=3), "takes no param(s) sesions"),
        (lambda: preset("nope"), "unknown preset 'nope'"),
        (lambda: preset("spec", foo=1), "takes no param(s) foo"),
        (lambda: synthetic(requests=None), "needs requests or duration"),
        (lambda: synthetic(rate=0), "rate must be > 0"),
        (lambda: synthetic(arrival="weekly"), "arrival must be one of"),
        (lambda: synthetic(tenants=-1), "tenants must be an integer >= 0"),
        (lambda: synthetic(priority_weights=()), "priority_weights"),
        (lambda: PrefixModel(p_system=1.5), "p_system must be a number <= 1"),
        (lambda: read_mooncake(DATA / "missing.jsonl"), "missing.jsonl: no such file"),
        (lambda: read_mooncake(DATA / "mooncake_small.jsonl", limit=-1), "limit must be"),
    ],
)
def test_bad_params_raise_workload_error(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(WorkloadError) as caught:
        call()
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


# --------------------------------------------------------------------------- malformed files

GOOD = '{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}'


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"timestamp": 0, "input_length": 1024', "bad JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"timestamp": 0, "input_length": 1024, "output_length": 1}', "missing field 'hash_ids'"),
        ('{"input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}', "missing field 'timestamp'"),
        (
            '{"timestamp": "0", "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}',
            "'timestamp' must be",
        ),
        (
            '{"timestamp": -5, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}',
            "'timestamp' is negative",
        ),
        (
            '{"timestamp": 0, "input_length": 10.5, "output_length": 1, "hash_ids": [1]}',
            "'input_length' must be an integer",
        ),
        (
            '{"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []}',
            "'input_length' is negative",
        ),
        (
            '{"timestamp": 0, "input_length": 1024, "output_length": -3, "hash_ids": [1, 2]}',
            "'output_length' is negative",
        ),
        (
            '{"timestamp": 0, "input_length": 1024, "output_length": true, "hash_ids": [1, 2]}',
            "'output_length' must be",
        ),
        (
            '{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": "1,2"}',
            "'hash_ids' must be a list",
        ),
        ('{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, "x"]}', "found 'x'"),
        (
            '{"timestamp": 0, "input_length": 4000, "output_length": 1, "hash_ids": [1, 2]}',
            "2 hash_ids for input_length 4000: expected 7 or 8",
        ),
        (
            '{"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [1, 2, 3]}',
            "expected 0 or 1",
        ),
        (
            '{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2], "priority": "2"}',
            "'priority' must be an integer",
        ),
        (
            '{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2], "tenant": [1]}',
            "'tenant' must be",
        ),
    ],
)
def test_malformed_mooncake_line_names_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(f"{GOOD}\n\n{GOOD}\n{bad_line}\n{GOOD}\n")
    with pytest.raises(WorkloadError) as caught:
        read_mooncake(path)
    assert str(caught.value).startswith(f"{path}:4: ")
    assert message in str(caught.value)


def test_mooncake_empty_and_binary_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(WorkloadError, match="no requests"):
        read_mooncake(empty)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(GOOD.encode() + b"\n\xff\xfe\n")
    with pytest.raises(WorkloadError, match=r"binary.jsonl:2: not UTF-8"):
        read_mooncake(binary)
    with pytest.raises(WorkloadError, match="is a directory"):
        read_mooncake(tmp_path)


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZURE_GOOD = "2023-11-16 18:17:03.9799600,4808,10"


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ("2023-11-16 18:17:03.9799600,4808", "2 fields, the header has 3"),
        ("yesterday,4808,10", "bad TIMESTAMP 'yesterday'"),
        ("2023-13-16 18:17:03.9799600,4808,10", "bad TIMESTAMP"),
        ("2023-11-16 25:17:03,4808,10", "bad TIMESTAMP"),
        ("2023-11-16 18:17:03.9799600,lots,10", "ContextTokens must be an integer, got 'lots'"),
        ("2023-11-16 18:17:03.9799600,4808,-1", "GeneratedTokens is negative"),
    ],
)
def test_malformed_azure_row_names_file_and_line(tmp_path: Path, bad_row: str, message: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(f"{AZURE_HEADER}\n{AZURE_GOOD}\n{AZURE_GOOD}\n{bad_row}\n{AZURE_GOOD}\n")
    with pytest.raises(WorkloadError) as caught:
        read_azure(path)
    assert str(caught.value).startswith(f"{path}:4: ")
    assert message in str(caught.value)


def test_azure_header_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(f"TIMESTAMP,Tokens\n{AZURE_GOOD}\n")
    with pytest.raises(
        WorkloadError, match=r"trace.csv:1: header lacks column\(s\) ContextTokens, GeneratedTokens"
    ):
        read_azure(path)
    path.write_text("")
    with pytest.raises(WorkloadError, match="empty file"):
        read_azure(path)


def test_workloads_module_does_not_import_torch() -> None:
    code = (
        "import sys; import engine_adapter.sim.workloads, engine_adapter.sim.cost_model; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("module_name", ["engine_adapter.sim.workloads", "engine_adapter.sim.cost_model"])
def test_all_names_exist(module_name: str) -> None:
    module = __import__(module_name, fromlist=["__all__"])
    assert len(set(module.__all__)) == len(module.__all__)
    assert [name for name in module.__all__ if not hasattr(module, name)] == []
