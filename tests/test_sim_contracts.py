"""Prompt-cache contracts in the simulator (issue 51, item 6): the trace fields, the radix model
honouring them through the engine's cache core, the row's figures, and the CLI.

- golden rows on a four-request trace, checked by hand (the derivations are in the tests);
- salts isolate (a block key includes the salt) and explicit mode writes only up to the breakpoint;
- properties: with a lifetime on every request and a host tier that holds every block, no
  retention is ever broken; a contract that asks for nothing (one salt for all) changes no figure
  of the row against the compiled loop's;
- a differential test: the same sequential workload through a `CacheManager` driven as the
  engine's scheduler drives it (tests/test_retention.py) and through the simulator gives the same
  hits, writes, grants and breaks;
- bad trace fields: one-line errors naming the line and the field; the CLI in a real process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.contract import CacheContract, CacheReceipt
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.tiers import TierConfig
from engine_adapter.sim.contracts import salted_keys
from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.mooncake_trace import mooncake_stream, read_mooncake
from engine_adapter.sim.request_table import RequestTable
from engine_adapter.sim.simulator import Simulator, simulate
from engine_adapter.sim.workloads import SimRequest, Workload, WorkloadError
from tests.cli_process import benchmark

BS = 512
# Every prefill step takes exactly 1 s, decode and loads nothing: the idle integrals are integers.
ONE_SECOND = CostModel(
    prefill_base_s=1.0,
    prefill_per_token_s=0.0,
    prefill_attn_s=0.0,
    decode_base_s=0.0,
    decode_per_seq_s=0.0,
    decode_per_context_token_s=0.0,
    kv_bytes_per_token=0.0,
    host_link_latency_s=0.0,
    disk_link_latency_s=0.0,
)

TRACE = [  # session a comes back after b and c have turned the 4-block pool over
    {"timestamp": 0, "input_length": 1024, "hash_ids": [1, 2], "session": "a", "cache_ttl_s": 100},
    {"timestamp": 10000, "input_length": 1024, "hash_ids": [3, 4], "session": "b"},
    {"timestamp": 20000, "input_length": 1024, "hash_ids": [5, 6], "session": "c"},
    {"timestamp": 30000, "input_length": 1536, "hash_ids": [1, 2, 7], "session": "a", "cache_ttl_s": 100},
]
for _record in TRACE:
    _record["output_length"] = 1  # one token: the request finishes with its prefill step


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _contract(tmp_path: Path, tiers: TierConfig | None) -> dict[str, Any]:
    row = simulate(
        read_mooncake(_write(tmp_path / "t.jsonl", TRACE)), "lru", 4, tiers=tiers, cost_model=ONE_SECOND
    )
    contract: dict[str, Any] = row.to_dict()["cache_contract"]
    return {**contract, "block_hits": row.block_hits}


def test_golden_row_without_a_lower_tier(tmp_path: Path) -> None:
    """No lower tier: a quarter of the 4-block pool (1 block) may hold retention pins. Request 0
    pins block 1 and is refused block 2 (1 refused); b and c evict 2 and 4, then 3 and 6 around
    the pinned 1; request 3 hits block 1 (a retention hit, its grant refreshed: 2 granted), its
    blocks 2 and 7 are refused (3 refused). Writes: 2+2+2+2 blocks. Idle device blocks: 2 over
    [1, 11] (with the 1 s steps: 18 + 2), 4 over [11, 20] (36), 2 while c runs (2), 4 over
    [21, 30] (36), block 5 while request 3 runs (1): 95 block-seconds."""
    assert _contract(tmp_path, None) == {
        "block_hits": 1,
        "retention_hit_blocks": 1,
        "retained_blocks": 1,
        "retention_granted_blocks": 2,
        "retention_refused_blocks": 3,
        "retention_broken_blocks": 0,
        "retention_expired_blocks": 0,
        "written_tokens": {"device": 4 * BS * 2, "host": 0, "disk": 0},
        "read_tokens": {"device": BS, "host": 0, "disk": 0},
        "idle_block_s": {"device": 95.0, "host": 0.0, "disk": 0.0},
    }


def test_golden_row_with_a_host_tier(tmp_path: Path) -> None:
    """A host tier: retention demotes instead of pinning. c evicts 2 then 1 (to host); request 3
    loads both back (2 retention hits, read from host) and evicts 4, 3 and 6 to host (5 blocks
    written there); grants: 2 + 2 refreshed + block 7. Device idle as without the tier (95);
    host idle: 2 blocks over [20, 30] and 3 over [30, 31] (the promoted ones left it): 23."""
    assert _contract(tmp_path, TierConfig(host_blocks=8)) == {
        "block_hits": 2,
        "retention_hit_blocks": 2,
        "retained_blocks": 3,
        "retention_granted_blocks": 5,
        "retention_refused_blocks": 0,
        "retention_broken_blocks": 0,
        "retention_expired_blocks": 0,
        "written_tokens": {"device": 7 * BS, "host": 5 * BS, "disk": 0},
        "read_tokens": {"device": 0, "host": 2 * BS, "disk": 0},
        "idle_block_s": {"device": 95.0, "host": 23.0, "disk": 0.0},
    }


def test_a_contract_row_says_why_it_ran_in_python(tmp_path: Path) -> None:
    sim = Simulator(read_mooncake(_write(tmp_path / "t.jsonl", TRACE)), "lru", 4)
    sim.run()
    assert sim.loop_label == "python (prompt-cache contracts: retention runs in the cache manager)"


def _request(i: int, at: float, ids: list[int], **fields: Any) -> dict[str, Any]:
    return {
        "timestamp": at * 1000,
        "input_length": len(ids) * BS,
        "output_length": 1,
        "hash_ids": ids,
        **fields,
    }


@pytest.mark.parametrize(
    ("salts", "hits"), [(("x", "x"), 2), (("x", "y"), 0), (("x", None), 0), ((None, None), 2)]
)
def test_salts_isolate_every_block(tmp_path: Path, salts: tuple[str | None, str | None], hits: int) -> None:
    records = [
        _request(i, 10 * i, [1, 2], **({} if salt is None else {"cache_salt": salt}))
        for i, salt in enumerate(salts)
    ]
    row = simulate(read_mooncake(_write(tmp_path / "s.jsonl", records)), "lru", 8, cost_model=ONE_SECOND)
    assert row.block_hits == hits


def test_salted_keys_are_int64_and_differ_by_salt() -> None:
    a, b = salted_keys("a", [1, 2, 3]), salted_keys("b", [1, 2, 3])
    assert a == salted_keys("a", [1, 2, 3]) and not set(a) & set(b) and not set(a) & {1, 2, 3}
    assert all(0 <= k < 2**63 for k in a + b)


def test_explicit_mode_writes_only_up_to_the_breakpoint(tmp_path: Path) -> None:
    """Request 0 (3 blocks) writes its first block only (a breakpoint at 700 tokens: one whole
    block); request 1, the same prompt, hits that block alone and writes the other two."""
    records = [_request(0, 0, [8, 9, 10], cache_breakpoint=700), _request(1, 10, [8, 9, 10])]
    row = simulate(read_mooncake(_write(tmp_path / "b.jsonl", records)), "lru", 16, cost_model=ONE_SECOND)
    assert row.block_hits == 1
    assert row.cache_contract is not None and row.cache_contract["written_tokens"]["device"] == 3 * BS


@pytest.mark.parametrize(
    ("field", "value", "what"),
    [
        ("cache_ttl_s", "1h", "'cache_ttl_s' must be a positive number of seconds"),
        ("cache_ttl_s", -5, "'cache_ttl_s' must be a positive number of seconds"),
        ("cache_ttl_s", True, "'cache_ttl_s' must be a positive number of seconds"),
        (
            "cache_breakpoint",
            2000,
            "'cache_breakpoint' must be an integer of tokens within [0, input_length=1024]",
        ),
        ("cache_breakpoint", 1.5, "'cache_breakpoint' must be an integer"),
        ("cache_salt", "", "'cache_salt' must be a non-empty string"),
        ("cache_salt", 7, "'cache_salt' must be a non-empty string"),
    ],
)
def test_a_bad_contract_field_is_a_one_line_error_naming_line_and_field(
    tmp_path: Path, field: str, value: object, what: str
) -> None:
    path = _write(tmp_path / "bad.jsonl", [_request(0, 0, [1, 2]), _request(1, 1, [1, 2], **{field: value})])
    for read in (read_mooncake, lambda p: list(mooncake_stream(p))):
        with pytest.raises(WorkloadError) as caught:
            read(path)
        message = str(caught.value)
        assert message.startswith(f"{path}:2: {what}") and "\n" not in message


def test_the_table_keeps_the_fields_and_the_stream_reads_them(tmp_path: Path) -> None:
    """The table's contract columns start at the first request that carries one (the ones before
    read none) and the streamed requests are the table's."""
    records = [
        _request(0, 0, [1]),
        _request(1, 1, [1], cache_salt="s", cache_ttl_s=30, cache_breakpoint=100),
        _request(2, 2, [1]),
    ]
    path = _write(tmp_path / "t.jsonl", records)
    table = read_mooncake(path).requests
    streamed = list(mooncake_stream(path))
    assert list(table) == streamed
    fields = [(r.cache_salt, r.cache_ttl_s, r.cache_breakpoint, r.block_hashes) for r in streamed]
    assert fields == [
        (None, None, None, (1,)),
        ("s", 30.0, 100, tuple(salted_keys("s", [1]))),
        (None, None, None, (1,)),
    ]
    assert (
        isinstance(table, RequestTable)
        and table.has_contracts()
        and list(table.take([2, 1])) == streamed[:0:-1]
    )
    plain = read_mooncake(
        _write(tmp_path / "p.jsonl", [records[0], _request(1, 1, [1]), records[2]])
    ).requests
    assert isinstance(plain, RequestTable) and not plain.has_contracts()
    assert plain.nbytes() < table.nbytes()  # no contract columns until one is carried


# ---- properties ---------------------------------------------------------------------------------

PREFIXES = [[1, 2, 3], [1, 2, 4], [5, 6], [5, 6, 7, 8], [9], [1, 10, 11]]


def _sim_request(i: int, ids: list[int], ttl: float | None, salt: str | None = None) -> SimRequest:
    return SimRequest(
        i, 10.0 * i, tuple(ids), len(ids) * BS, 1, session=f"s{ids[0]}", cache_ttl_s=ttl, cache_salt=salt
    )


picks = st.lists(
    st.tuples(st.integers(0, len(PREFIXES) - 1), st.sampled_from([None, 15.0, 35.0, 95.0])),
    min_size=1,
    max_size=12,
)


@pytest.mark.slow  # a hypothesis run or a CLI process: the full run's
@settings(max_examples=40, deadline=None)
@given(picks=picks, capacity=st.integers(4, 8))
def test_a_lifetime_on_every_request_and_an_ample_host_tier_break_nothing(
    picks: list[tuple[int, float | None]], capacity: int
) -> None:
    requests = [_sim_request(i, PREFIXES[p], 95.0) for i, (p, _) in enumerate(picks)]
    row = simulate(
        Workload(requests, BS, "test"), "lru", capacity, tiers=TierConfig(host_blocks=16), max_running=2
    )
    assert row.cache_contract is not None and row.cache_contract["retention_broken_blocks"] == 0


_SAME = (
    "block_hits",
    "hit_rate",
    "evictions",
    "preemptions",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "re_prefill_rate",
)


@pytest.mark.slow  # a hypothesis run or a CLI process: the full run's
@settings(max_examples=25, deadline=None)
@given(picks=picks, capacity=st.integers(4, 8))
def test_a_contract_asking_nothing_changes_no_figure(
    picks: list[tuple[int, float | None]], capacity: int
) -> None:
    """One salt on every request isolates nothing from anything: the contract row (Python loop,
    the cache manager) has the plain row's figures (the compiled loop where built)."""
    plain = [_sim_request(i, PREFIXES[p], None) for i, (p, _) in enumerate(picks)]
    salted = [_sim_request(i, salted_keys("t", PREFIXES[p]), None, "t") for i, (p, _) in enumerate(picks)]
    a = simulate(Workload(plain, BS, "test"), "lru", capacity, max_running=2).to_dict()
    b = simulate(Workload(salted, BS, "test"), "lru", capacity, max_running=2).to_dict()
    assert "cache_contract" not in a and "cache_contract" in b
    assert {k: a[k] for k in _SAME} == {k: b[k] for k in _SAME}


def _engine_figures(requests: list[SimRequest], capacity: int, tiers: TierConfig | None) -> dict[str, int]:
    """The requests through the engine's cache manager, one at a time as the scheduler hands them:
    admitted at arrival (its prefix hit, its blocks committed), finished 1 s later."""
    now = 0.0
    m = CacheManager(
        BlockAllocator(capacity, BS), policy="lru", clock=lambda: now, tiers=tiers, record_events=False
    )
    hits = written = 0
    for r in requests:
        now = r.arrival_s
        tokens = len(r.block_hashes) * BS
        receipt = CacheReceipt(tokens)
        contract = CacheContract(r.session, r.cache_ttl_s, r.cache_breakpoint)
        request = CacheRequest(
            r.request_id, num_tokens=tokens, block_keys=r.block_hashes, conversation=r.session,
            recompute_last_token=False, contract=contract, receipt=receipt,
        )  # fmt: skip
        alloc = m.allocate(request)
        m.commit_blocks(r.request_id, block_keys=r.block_hashes, num_computed_tokens=tokens)
        now += 1.0 if alloc.num_cached_tokens < tokens else 0.0
        m.free_sequence(r.request_id, block_keys=r.block_hashes, num_computed_tokens=tokens)
        if tiers is not None:
            m.take_moves()
        hits += alloc.num_cached_tokens // BS
        written += receipt.written_tokens
    counters = m.retention_counters()
    return {
        "hits": hits,
        "written": written,
        **{
            k: counters[k]
            for k in ("retention_granted_blocks", "retention_refused_blocks", "retention_broken_blocks")
        },
    }


@pytest.mark.slow  # a hypothesis run or a CLI process: the full run's
@settings(max_examples=40, deadline=None)
@given(picks=picks, capacity=st.integers(4, 8), host=st.sampled_from([0, 2, 4, 16]))
def test_the_simulator_and_the_engines_cache_agree(
    picks: list[tuple[int, float | None]], capacity: int, host: int
) -> None:
    """Arrivals 10 s apart, lifetimes of 15, 35 or 95 s: no expiry falls within a request's
    1 s step, so both sides see the same lapses (the simulator's steps take exactly 1 s)."""
    # one salt for all (isolating nothing): a row with no lifetime asked is a contract row too
    requests = [_sim_request(i, PREFIXES[p], ttl, "t") for i, (p, ttl) in enumerate(picks)]
    tiers = TierConfig(host_blocks=host) if host else None
    row = simulate(
        Workload(requests, BS, "test"), "lru", capacity, tiers=tiers, cost_model=ONE_SECOND, max_running=1
    )
    assert row.cache_contract is not None
    sim = {
        "hits": row.block_hits,
        "written": row.cache_contract["written_tokens"]["device"],
        **{
            k: row.cache_contract[k]
            for k in ("retention_granted_blocks", "retention_refused_blocks", "retention_broken_blocks")
        },
    }
    assert sim == _engine_figures(requests, capacity, tiers)


# ---- the CLI ------------------------------------------------------------------------------------


@pytest.mark.slow  # a hypothesis run or a CLI process: the full run's
def test_the_cli_runs_a_trace_with_contracts_and_shows_their_columns(tmp_path: Path) -> None:
    trace = _write(tmp_path / "contracts.jsonl", TRACE)
    out = tmp_path / "out.json"
    done = benchmark(
        "--mode", "sim", "--trace", str(trace), "--eviction-policies", "lru", "--capacity-blocks", "4",
        "--host-capacity-ratio", "1.0", "--output", str(out), home=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for title in ("Retained hits", "Breaks", "Wrote host", "Read host", "Idle host blk·s"):
        assert title in done.stdout
    assert "prompt-cache contracts" in done.stdout  # the caption says why the rows ran in Python
    rows = json.loads(out.read_text())["results"]
    tiered = next(r for r in rows if r["policy"] == "lru" and r["host_capacity_blocks"])
    assert tiered["cache_contract"]["retention_hit_blocks"] == 2
    assert tiered["cache_contract"]["read_tokens"]["host"] == 2 * BS


@pytest.mark.slow  # a hypothesis run or a CLI process: the full run's
def test_the_cli_refuses_a_bad_contract_field_in_one_line(tmp_path: Path) -> None:
    trace = _write(tmp_path / "bad.jsonl", [_request(0, 0, [1, 2]), _request(1, 1, [1, 2], cache_ttl_s="1h")])
    done = benchmark("--mode", "sim", "--trace", str(trace), "--capacity-blocks", "4", home=tmp_path)
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == f"Error: {trace}:2: 'cache_ttl_s' must be a positive number of seconds or null, got '1h'"
    )


@pytest.mark.slow  # runs the benchmark's reference rows too
def test_the_library_entry_point_takes_a_trace_with_contracts(tmp_path: Path) -> None:
    from engine_adapter.sim import Trace
    from engine_adapter.sim import simulate as library_simulate

    results = library_simulate(Trace.read(_write(tmp_path / "t.jsonl", TRACE)), "lru", capacities=[4])
    lru = next(row for row in results.rows if row["policy"] == "lru")
    assert lru["cache_contract"]["retention_hit_blocks"] == 1
    assert lru["event_loop"].startswith("python (prompt-cache contracts")


@pytest.mark.slow  # a hypothesis run
@settings(max_examples=30, deadline=None)
@given(picks=picks, capacity=st.integers(4, 8), host=st.sampled_from([0, 4]))
def test_the_idle_device_blocks_are_every_unreferenced_cached_block(
    picks: list[tuple[int, float | None]], capacity: int, host: int
) -> None:
    """Each count the idle integral takes is the cached blocks no request references, counted
    block by block over the whole tree (the model counts them from the running requests)."""
    from engine_adapter.sim.contract_model import ContractRadixModel

    measure = ContractRadixModel._measure
    seen = []

    def checked(model: ContractRadixModel) -> None:
        measure(model)
        blocks = model.manager.radix._blocks.values()
        seen.append((model._held[0], sum(1 for b in blocks if b.ref_count == 0)))

    requests = [_sim_request(i, PREFIXES[p], ttl, "t") for i, (p, ttl) in enumerate(picks)]
    tiers = TierConfig(host_blocks=host) if host else None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ContractRadixModel, "_measure", checked)
        simulate(Workload(requests, BS, "test"), "lru", capacity, tiers=tiers, max_running=3)
    assert seen and all(counted == brute for counted, brute in seen)
