"""Request receipts (issue 51 item 5) on a real cache manager: the table keeps the last 4,096
requests and the totals at most 1,024 tenant-and-salt rows; each missed block's reason is the
right one (first use, evicted with its eviction id, a different salt, explicit mode, generated
tokens not stored, a lifetime that lapsed, dropped from the host tier, unknown past the window);
and for any mix of prompts, salts, explicit writes and pool sizes (hypothesis) every receipt adds
up: read + written + uncached = prompt tokens, and its miss runs cover exactly what it did not read.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.contract import CacheContract, CacheReceipt
from engine_adapter.cache.receipts import RECEIPTS_CAPACITY, salt_label
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.retention import RetentionConfig
from engine_adapter.cache.tiers import TierConfig
from sage_eviction.metrics import MAX_TENANTS, OTHER_TENANTS

BS = 4


class _Run:
    """A cache manager on a test clock, and requests run through it whole (admit, cache, free)."""

    def __init__(self, num_blocks: int, **kwargs: Any) -> None:
        self.now = 0.0
        self.cache = CacheManager(BlockAllocator(num_blocks, BS), clock=lambda: self.now, **kwargs)
        self.next_id = 0

    def ask(
        self,
        prompt: list[int],
        *,
        salt: str | None = None,
        tenant: str | None = None,
        contract: CacheContract | None = None,
        output: list[int] | None = None,
        cache: bool = True,
    ) -> dict[str, Any]:
        """Run one request (its `output` tokens appended before it is freed; not cached when
        not `cache`: an aborted request); its receipt."""
        sid = self.next_id = self.next_id + 1
        receipt = CacheReceipt(len(prompt))
        request = CacheRequest(
            sid,
            prompt,
            cache_salt=salt,
            tenant=tenant,
            request_id=f"req-{sid}",
            contract=contract,
            receipt=receipt,
        )
        self.cache.allocate(request)
        tokens = prompt + (output or [])
        if output:
            self.cache.extend(sid, -(-len(tokens) // BS) - len(self.cache.block_table(sid)))
        self.cache.free_sequence(sid, tokens, cache=cache)
        answer = self.cache.request_receipt(f"req-{sid}")
        assert answer is not None
        return answer


def _reasons(receipt: dict[str, Any]) -> list[str]:
    return [m["reason"] for m in receipt["misses"]]


def _adds_up(receipt: dict[str, Any]) -> None:
    read = sum(receipt["read_tokens"].values())
    assert read == receipt["cached_tokens"]
    assert read + receipt["written_tokens"] + receipt["uncached_tokens"] == receipt["prompt_tokens"]
    assert sum(m["tokens"] for m in receipt["misses"]) == receipt["prompt_tokens"] - read
    first = read // receipt["block_size"]
    for miss in receipt["misses"]:  # the runs follow each other, in prompt order
        assert miss["first_block"] == first
        first += miss["blocks"]


P = list(range(1, 18))  # 17 tokens: four full blocks and a partial one


def test_first_use_then_evicted_by_lru_with_its_eviction_id() -> None:
    run = _Run(8)
    first = run.ask(P)
    assert first["misses"] == [
        {"first_block": 0, "blocks": 4, "tokens": 16, "reason": "first_use"},
        {"first_block": 4, "blocks": 1, "tokens": 1, "reason": "partial_block"},
    ]
    assert (first["written_tokens"], first["uncached_tokens"]) == (16, 1)
    run.now = 5.0
    run.ask(list(range(100, 130)))  # 7 blocks of a pool of 8: P's blocks go
    back = run.ask(P, cache=False)  # aborted: it writes nothing back
    evicted = back["misses"][0]
    assert evicted["reason"] == "evicted" and evicted["policy"] == "lru" and evicted["at"] == 5.0
    assert evicted["eviction_id"] >= 1 and evicted["first_block"] == 0
    again = run.ask(P)  # the ghost set forgot P's ghosts when `back` missed them: the receipts did not
    assert again["misses"][0] == evicted
    for receipt in (first, back, again):
        _adds_up(receipt)


def test_a_different_salt_is_named_by_its_hash_never_in_clear() -> None:
    run = _Run(64)
    run.ask(P, salt="tenant-a-secret")
    other = run.ask(P, salt="tenant-b-secret")
    assert other["salt"] == salt_label("tenant-b-secret") and "secret" not in json.dumps(other)
    run_ = other["misses"][0]
    assert run_["reason"] == "other_salt" and run_["blocks"] == 4
    assert run_["salt"] == salt_label("tenant-a-secret") and run_["cached"] is True
    plain = run.ask(P)  # no salt: the same tokens are cached under a salt
    assert plain["misses"][0]["reason"] == "other_salt"


def test_a_salted_miss_of_tokens_evicted_under_no_salt_says_so() -> None:
    run = _Run(8)
    run.ask(P)
    run.ask(list(range(100, 130)))  # P's blocks leave: ghosts under their unsalted keys
    salted = run.ask(P, salt="x")
    assert salted["misses"][0] == {
        "first_block": 0, "blocks": 4, "tokens": 16, "reason": "other_salt", "salt": None, "cached": False
    }  # fmt: skip


def test_explicit_mode_and_generated_tokens_not_stored() -> None:
    run = _Run(64, retention=RetentionConfig(cache_generated=False))
    run.ask(P, contract=CacheContract(write_tokens=8))  # a breakpoint after two blocks
    back = run.ask(P)
    assert back["read_tokens"]["device"] == 8
    assert back["misses"][0] == {"first_block": 2, "blocks": 2, "tokens": 8, "reason": "explicit_mode",
                                 "at": 0.0}  # fmt: skip
    run.ask(P[:8], output=list(range(200, 212)))  # its three generated blocks are freed at its finish
    turn = run.ask([*P[:8], *range(200, 212), 7])  # the next turn sends the answer back
    assert _reasons(turn)[0] == "generated_not_stored" and turn["misses"][0]["first_block"] == 2


def test_a_lapsed_lifetime_then_an_eviction() -> None:
    run = _Run(16, retention=RetentionConfig(max_retained_fraction=0.5))
    kept = run.ask(P, contract=CacheContract(ttl_s=10.0))
    assert kept["retention_ttl_s"] == 10.0
    run.ask(list(range(100, 145)))  # 11 blocks: P's four retained blocks hold
    assert run.ask(P)["read_tokens"]["device"] == 16
    run.now = 30.0  # the lifetime lapsed at 10 + the refresh
    run.ask(list(range(300, 350)))
    back = run.ask(P)
    lapsed = back["misses"][0]
    assert lapsed["reason"] == "lapsed" and lapsed["lapsed_at"] <= 30.0 and lapsed["at"] == 30.0


def test_dropped_from_the_host_tier() -> None:
    run = _Run(8, tiers=TierConfig(host_blocks=4))
    run.ask(P)
    for i in range(2):  # the device evicts P to host, then the host drops it for the next
        run.now = 1.0 + i
        run.ask(list(range(100 + 40 * i, 130 + 40 * i)))
    back = run.ask(P)
    assert back["misses"][0]["reason"] == "dropped" and back["misses"][0]["tier"] == "host"
    _adds_up(back)


def test_unknown_once_the_windows_forget() -> None:
    run = _Run(8, ghost_factor=0.5)  # the ghost set keeps 4 keys
    run.ask(P)
    for i in range(6):
        run.ask(list(range(100 + 40 * i, 130 + 40 * i)))
    late = run.ask(list(range(1000, 1017)))
    assert _reasons(late)[0] == "unknown" and "window" in late["misses"][0]["note"]


@pytest.mark.slow  # 4,196 requests through a manager: 2 s
def test_the_table_keeps_the_last_4096_requests() -> None:
    run = _Run(16)
    for i in range(RECEIPTS_CAPACITY + 100):
        run.ask([i % 250, i // 250, 5, 6, 7])
    assert len(run.cache._receipts) == RECEIPTS_CAPACITY
    assert run.cache.request_receipt("req-1") is None and run.cache.request_receipt("req-100") is None
    assert run.cache.request_receipt("req-101") is not None
    assert run.cache.request_receipt("latest")["id"] == f"req-{RECEIPTS_CAPACITY + 100}"  # type: ignore[index]


def test_the_totals_keep_at_most_1024_tenant_and_salt_rows() -> None:
    run = _Run(64)
    for i in range(MAX_TENANTS + 50):
        run.ask([1, 2, 3, 4, 5], tenant=f"t{i}")
    accounts = run.cache.cache_accounts()
    assert len(accounts) == MAX_TENANTS
    other = [a for a in accounts if a["tenant"] == OTHER_TENANTS]
    assert len(other) == 1 and other[0]["requests"] == 51
    assert sum(a["requests"] for a in accounts) == MAX_TENANTS + 50
    assert sum(a["written_tokens"] for a in accounts) == 4
    stats = run.cache.stats().to_dict()
    assert stats["cache_accounts"] == accounts


_PROMPTS = st.lists(st.integers(0, 5), min_size=1, max_size=4).map(
    lambda parts: [t for p in parts for t in range(10 * p + 1, 10 * p + 7)]
)


@settings(max_examples=40, deadline=None)
@given(
    num_blocks=st.integers(6, 24),
    asks=st.lists(
        st.tuples(
            _PROMPTS, st.sampled_from([None, "a", "b"]), st.sampled_from([None, 0, 4, 9]), st.integers(0, 9)
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_every_receipt_adds_up(
    num_blocks: int, asks: list[tuple[list[int], str | None, int | None, int]]
) -> None:
    run = _Run(num_blocks)
    receipts = []
    for prompt, salt, write, out in asks:
        if -(-(len(prompt) + out) // BS) > num_blocks:
            continue
        contract = None if write is None else CacheContract(write_tokens=write)
        receipts.append(run.ask(prompt, salt=salt, contract=contract, output=list(range(500, 500 + out))))
    for receipt in receipts:
        _adds_up(receipt)
    written = sum(r["written_tokens"] for r in receipts)
    assert sum(a["written_tokens"] for a in run.cache.cache_accounts()) == written


def test_after_a_cache_reset_a_dropped_prefix_is_not_called_first_use() -> None:
    run = _Run(64)
    run.ask(P)
    run.now = 7.0
    run.cache.reset_prefix_cache()  # drops P's blocks without an eviction, so without ghosts
    back = run.ask(P)
    assert back["misses"][0]["reason"] == "unknown" and back["misses"][0]["at"] == 7.0
    assert "reset" in back["misses"][0]["note"]


def test_a_broken_lifetime_is_billed_to_the_request_and_its_tenant_and_salt() -> None:
    """A's four blocks (10 s) go to the host tier; B's longer lifetimes (100 s) come down behind
    them, so A's blocks are dropped before their expiry (then B's first run for its second):
    every break is billed to the request whose lifetime it cut and to its tenant and salt."""
    run = _Run(8, tiers=TierConfig(host_blocks=4))
    a = run.ask(P, tenant="t-a", salt="s-a", contract=CacheContract(ttl_s=10.0))
    b = [
        run.ask(list(range(start, start + 25)), tenant="t-b", contract=CacheContract(ttl_s=100.0))
        for start in (100, 200)  # six blocks each
    ]
    stats = run.cache.stats()
    receipts = [run.cache.request_receipt(r["id"]) for r in (a, *b)]
    broken = [r["retention_broken_tokens"] for r in receipts if r is not None]
    assert broken[0] == 4 * BS  # all four of A's
    assert sum(broken) == stats.retention_broken_blocks * BS
    rows = {(r["tenant"], r["salt"]): r["retention_broken_tokens"] for r in stats.cache_accounts}
    assert rows == {("t-a", salt_label("s-a")): broken[0], ("t-b", None): sum(broken[1:])}
