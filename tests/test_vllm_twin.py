"""The `vllm` cache model (engine_adapter/sim/twins): vLLM v1's pool and scheduler, without vLLM.

Golden hits are derived by hand from vLLM's rules (block size 4): the null block, the
(L-1) // block_size cap, decode blocks cached, tail-first freeing, duplicate hashes taking the
first block. The proof against the real package is tests_integration/vllm/test_twin.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cli_process import benchmark
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapter.sim.twins import TWINS
from engine_adapter.sim.twins.chats import chat_script, stand_in_answers, token_workload
from engine_adapter.sim.twins.vllm_pool import BlockPool, chained_hashes
from engine_adapter.sim.twins.vllm_run import sequence_hashes, simulate_vllm
from engine_adapter.sim.twins.vllm_sched import TwinSequence, VllmSchedulerConfig, VllmTwin
from engine_adapter.sim.workloads import SimRequest, Workload
from sage_cli.benchmark.options import CACHE_MODELS as CLI_CACHE_MODELS
from sage_cli.benchmark.options import simulator_names


def _run_alone(pool_blocks: int, requests: list[tuple[list[int], list[int]]], bs: int = 4) -> list[int]:
    """Each (prompt, output) run to completion before the next: its num_cached_tokens."""
    return _twin_alone(pool_blocks, requests, bs)[0]


def _twin_alone(
    pool_blocks: int, requests: list[tuple[list[int], list[int]]], bs: int
) -> tuple[list[int], VllmTwin]:
    twin = VllmTwin(VllmSchedulerConfig(pool_blocks, bs), BlockPool(pool_blocks, True, bs))
    hits = []
    for i, (prompt, output) in enumerate(requests):
        seq = TwinSequence(i, len(prompt), len(output), chained_hashes(prompt + output, bs))
        twin.add(seq)
        while twin.has_unfinished():
            twin.step()
        hits.append(seq.num_cached_tokens)
    return hits, twin


def test_the_golden_hits_of_vllms_rules() -> None:
    p8 = list(range(1, 9))
    # r0 caches 2 blocks; r1 (the same 8 tokens) hits 1 block: the last token is always computed;
    # r1 recomputes block 2 into a new block (a duplicate hash); r2 hits both (12 tokens, cap 2).
    assert _run_alone(4, [(p8, [90]), (p8, [90]), ([*p8, 9, 10, 11, 12], [90])]) == [0, 4, 8]


def test_the_answers_blocks_are_cached_for_the_next_turn() -> None:
    prompt, answer = [1, 2, 3, 4, 5, 6], [7, 8, 9, 10]
    # 6 + 3 computed tokens fill 2 blocks (the last sampled token is never computed).
    nxt = [*prompt, *answer, 11, 12, 13]
    assert _run_alone(8, [(prompt, answer), (nxt, [1])]) == [0, 8]
    # The radix and flat models see the prompt's blocks only; vLLM hits the answer's block too.


def test_a_freed_chain_loses_its_tail_first() -> None:
    p8, q8 = list(range(1, 9)), list(range(20, 28))
    # r1 needs two blocks: the uncached one, then r0's tail (freed first); r0's head survives.
    hits, twin = _twin_alone(4, [(p8, [90]), (q8, [90]), ([*p8, 9, 10, 11, 12], [90])], 4)
    assert hits == [0, 0, 4]
    # r1 evicted r0's tail, r2 both of r1's blocks; of the three only r0's tail came back (r2
    # missed it and recomputed it): one re-prefill.
    assert (twin.pool.evictions, twin.reprefill.re_prefilled) == (3, 1)


def test_a_request_waits_until_its_whole_prompt_fits() -> None:
    # 5 usable blocks, 8 tokens a step: r0 (8 tokens, 3 answers) holds 3 blocks while it decodes;
    # r1's 20 tokens need 5, so it waits for r0 rather than taking a chunk and being preempted.
    twin = VllmTwin(VllmSchedulerConfig(6, 4, max_num_batched_tokens=8), BlockPool(6, True, 4))
    r0 = TwinSequence(0, 8, 3, chained_hashes([*range(1, 9), 7, 7, 7], 4))
    r1 = TwinSequence(1, 20, 1, chained_hashes([*range(30, 50), 7], 4))
    twin.add(r0)
    twin.add(r1)
    while twin.has_unfinished():
        twin.step()
    assert twin.preemptions == 0 and r1.num_cached_tokens == 0


def test_n_blocks_hold_n_minus_one() -> None:
    pool = BlockPool(5, True, 4)
    assert pool.get_num_free_blocks() == 4 and pool.null_block.block_id == 0
    blocks = pool.get_new_blocks(4)
    assert sorted(b.block_id for b in blocks) == [1, 2, 3, 4]
    assert pool.get_num_free_blocks() == 0


def test_freeing_puts_tails_first_and_uncached_blocks_at_the_head() -> None:
    pool = BlockPool(6, True, 4)
    a, b, c = pool.get_new_blocks(3)
    for i, block in enumerate((a, b)):
        pool._insert_block_hash(("h", i), block, 4 * (i + 1))
    pool.free_blocks(reversed([a, b, c]))  # c has no hash: reused first; then b (the tail), then a
    assert pool.free_block_queue.block_ids() == [c.block_id, 4, 5, b.block_id, a.block_id]


_REQUESTS = st.lists(
    st.tuples(st.lists(st.integers(1, 3), min_size=1, max_size=24), st.integers(1, 6)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(requests=_REQUESTS, pool=st.integers(9, 20), gap=st.sampled_from([0.0, 100.0]))
def test_hits_are_capped_and_the_pool_keeps_its_null_block(
    requests: list[tuple[list[int], int]], pool: int, gap: float
) -> None:
    bs = 4
    sims = []
    for i, (prompt, out) in enumerate(requests):
        tokens = (*prompt, *[7] * out)
        keys = tuple(chained_hashes(prompt, bs))
        sims.append(SimRequest(i, i * gap, keys, len(prompt), out, session="s", token_ids=tokens))
    workload = Workload(sims, bs, "test")
    run = simulate_vllm(workload, "lru", pool, max_num_batched_tokens=64)
    unbounded = simulate_vllm(workload, "unbounded")
    for r, hit, most in zip(sims, run.hit_tokens, unbounded.hit_tokens, strict=True):
        assert hit % bs == 0 and 0 <= hit <= (r.input_len - 1) // bs * bs
        if gap:  # one at a time: a bounded pool never hits more than the unbounded one
            assert hit <= most
    assert run.result.requests == len(sims)


def test_a_sage_policy_runs_in_the_twins_pool_through_the_vllm_mixin() -> None:
    script = chat_script(requests=40, chats=4, seed=3)
    answers = stand_in_answers(script)
    workload = token_workload(script, script.prompts(answers), answers, block_size=32, gap_s=100.0)
    lru = simulate_vllm(workload, "lru", 24)
    lfu = simulate_vllm(workload, "lfu", 24)
    assert lru.result.evictions > 0 and lfu.result.evictions > 0
    assert lfu.hit_tokens != lru.hit_tokens  # its own victims, not vLLM's order
    assert lfu.result.policy == "lfu"


def test_block_keys_only_key_the_answer_from_the_next_turn() -> None:
    first = SimRequest(0, 0.0, ("a", "b"), 8, 5, session="s")
    second = SimRequest(1, 1.0, ("a", "b", "c", "d"), 16, 1, session="s")
    keys = sequence_hashes(Workload([first, second], 4, "test"), 4)
    assert keys[0] == ["a", "b", "c"]  # 8 + 4 computed tokens: 3 blocks, the third the next turn's
    assert keys[1][:4] == ["a", "b", "c", "d"]


def test_the_cli_offers_every_cache_model() -> None:
    from engine_adapter.sim.simulator import CACHE_MODELS

    assert (*CACHE_MODELS, *TWINS) == CLI_CACHE_MODELS


def test_the_cli_reads_the_simulators_one_list_of_names(tmp_path: Path) -> None:
    """engine_adapter/sim/model_names.py is the one list (issue 50, item 6): a twin registered
    there alone (in a copy) is one more choice the CLI reads, and the CLI's loader reads the
    installed file without importing engine_adapter."""
    from engine_adapter.sim import model_names

    source = Path(model_names.__file__).read_text(encoding="utf-8")
    anchor = '    "sage": "engine_adapter.sim.twins.sage_run:simulate_sage",\n'  # the last twin
    assert anchor in source
    copy = tmp_path / "model_names.py"
    copy.write_text(source.replace(anchor, anchor + '    "trtllm": "x:y",\n'), encoding="utf-8")
    assert simulator_names(copy)["CACHE_MODELS"] == (*model_names.CACHE_MODELS, "trtllm")
    assert simulator_names()["TWINS"] == TWINS


def _sage(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return benchmark(*args, home=cwd, timeout=600)


@pytest.mark.slow
def test_the_benchmark_runs_the_vllm_model_in_a_real_process(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = _sage("--eviction-policies", "lru,lfu", "--cache-model", "vllm", "--block-size", "32",
                 "--requests", "120", "--jobs", "1", "--output", str(out), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["settings"]["cache_model"] == "vllm" and result["settings"]["block_size"] == 32
    assert result["workload"]["block_size"] == 32
    rows = result["results"]
    assert [r["policy"] for r in rows][-1] == "unbounded" and "belady" not in {r["policy"] for r in rows}
    assert {r["cache_model"] for r in rows} == {"vllm"}
    assert all(0 < r["hit_rate"] <= rows[-1]["hit_rate"] for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--block-size", "0"], "--block-size 0: give a positive number of tokens"),
        (["--trace", "mooncake:conversation", "--requests", "50", "--block-size", "32"],
         "the mooncake trace's block keys stand for 512 tokens"),
        (["--capacity-blocks", "3", "--block-size", "16", "--requests", "50"],
         "in the vllm model; give at least"),
        (["--cache-model", "sglangx"], "Invalid value for '--cache-model'"),
    ],
)  # fmt: skip
def test_bad_options_are_refused_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    model = [] if "--cache-model" in args else ["--cache-model", "vllm"]
    proc = _sage("--eviction-policies", "lru", *model, *args, "--jobs", "1", cwd=tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
