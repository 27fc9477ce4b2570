"""`PolicyBridge`, the one translation from engine cache events to sage's incremental calls
(sage_eviction/integrations/bridge.py), without any engine: its tolerance of engine replays, its
all-or-nothing and protected evictions, its put-back of refused victims, and its event log,
which a fresh policy must replay to the same victims. The engines themselves are tested against
their real packages in tests_integration/ (docs/integrations.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_eviction import PolicyConfigError, create_policy
from sage_eviction.integrations import PolicyBridge, UnsupportedEngineVersion, check_version


def test_the_spec_comes_from_the_argument_or_the_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGE_POLICY", "slru:protected_threshold=3")
    assert PolicyBridge(engine="x").policy.name == "slru"
    assert PolicyBridge("fifo", engine="x").policy.name == "fifo"
    monkeypatch.setenv("OTHER", "s3fifo")
    assert PolicyBridge(capacity=10, engine="x", env_var="OTHER").policy.capacity == 10
    monkeypatch.delenv("SAGE_POLICY")
    with pytest.raises(PolicyConfigError, match="no policy given; set SAGE_POLICY=name:k=v"):
        PolicyBridge(engine="vllm")
    with pytest.raises(PolicyConfigError, match="needs the future"):
        PolicyBridge("belady", engine="vllm")
    with pytest.raises(PolicyConfigError, match="unknown eviction policy 'nosuch'"):
        PolicyBridge("nosuch", engine="vllm")


def test_engine_replays_are_counted_not_raised() -> None:
    bridge = PolicyBridge("lru", engine="x")
    assert bridge.insert("a", evictable=True)
    assert not bridge.insert("a", evictable=False)  # a replayed insert only updates the flag
    assert not bridge.is_evictable("a")
    assert not bridge.access("ghost") and bridge.remove("ghost") is None
    assert not bridge.set_evictable("ghost", True)
    assert bridge.stats.ignored == 4 and bridge.stats.inserts == 1


def test_exact_eviction_is_all_or_nothing_and_protected_keys_stay() -> None:
    bridge = PolicyBridge("fifo", engine="x")
    for key in "abc":
        bridge.insert(key, evictable=True)
    assert bridge.evict(3, protected={"a"}, exact=True) == []
    assert len(bridge) == 3 and bridge.stats.refused_evictions == 1
    assert bridge.evict(2, protected={"a"}, exact=True) == ["b", "c"]
    assert bridge.is_evictable("a")  # protection lasts one call


def test_a_refused_victim_goes_back_with_its_metadata() -> None:
    bridge = PolicyBridge("lfu", engine="x")
    for key in "abc":
        bridge.insert(key, evictable=True)
    for _ in range(3):
        bridge.access("c")
    assert bridge.evict(1, eligible=lambda k: k != "a") == ["b"]
    assert "a" in bridge and bridge.is_evictable("a")
    assert bridge.policy.meta("c").hits == 3
    assert bridge.evict(2) == ["a", "c"]


def test_clear_starts_a_fresh_policy_of_the_same_spec() -> None:
    bridge = PolicyBridge("s3fifo:small_ratio=0.25", 8, engine="x")
    bridge.insert(1, evictable=True)
    bridge.clear()
    assert len(bridge) == 0 and bridge.policy.name == "s3fifo" and bridge.policy.capacity == 8


events = st.lists(
    st.tuples(st.sampled_from(["insert", "access", "pin", "unpin", "remove", "evict"]), st.integers(0, 9)),
    max_size=80,
)


@pytest.mark.parametrize("spec", ["lru", "lfu", "s3fifo", "arc", "gdsf", "sieve"])
@settings(max_examples=30, deadline=None)
@given(ops=events)
def test_the_log_replays_to_the_same_victims(
    tmp_path_factory: pytest.TempPathFactory, spec: str, ops
) -> None:
    log = tmp_path_factory.mktemp("log") / "events.jsonl"
    bridge = PolicyBridge(spec, 6, engine="x", log_path=str(log), clock=lambda: 0.0)
    victims = []
    for op, key in ops:
        if op == "insert":
            bridge.insert(key, evictable=True)
        elif op == "access":
            bridge.access(key)
        elif op in ("pin", "unpin"):
            bridge.set_evictable(key, op == "unpin")
        elif op == "remove":
            bridge.remove(key)
        else:
            victims += bridge.evict(1 + key % 3, protected={key})
    records = [json.loads(line) for line in Path(log).read_text().splitlines()]
    assert records[0]["op"] == "start" and records[0]["spec"] == spec
    policy = create_policy(spec, 6)
    replayed = []
    for r in records[1:]:
        if r["op"] == "insert":
            policy.insert(r["key"], evictable=r["evictable"])
        elif r["op"] == "access":
            policy.access(r["key"], r["now"])
        elif r["op"] == "evictable":
            policy.set_evictable(r["key"], r["evictable"])
        elif r["op"] == "remove":
            policy.remove(r["key"])
        elif r["op"] == "evict":
            shielded = r["protected"]
            for k in shielded:
                policy.set_evictable(k, False)
            chosen = policy.evict(r["n"])
            for k in shielded:
                policy.set_evictable(k, True)
            assert chosen == r["victims"]
            replayed += chosen
    assert replayed == victims


def test_an_engine_that_is_not_installed_is_refused() -> None:
    with pytest.raises(UnsupportedEngineVersion, match="sglang is not installed"):
        check_version("sglang")


def test_an_untested_release_is_refused_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    from sage_eviction.integrations import compat

    monkeypatch.setattr(compat, "installed_version", lambda engine: "0.31.2")
    monkeypatch.delenv("SAGE_ALLOW_UNTESTED_ENGINE", raising=False)
    with pytest.raises(UnsupportedEngineVersion, match=r"tested with vllm 0\.32\.x, not 0\.31\.2"):
        check_version("vllm")
    monkeypatch.setenv("SAGE_ALLOW_UNTESTED_ENGINE", "1")
    with pytest.warns(RuntimeWarning, match="not 0.31.2"):
        assert check_version("vllm") == "0.31.2"
    monkeypatch.delenv("SAGE_ALLOW_UNTESTED_ENGINE")
    monkeypatch.setattr(compat, "installed_version", lambda engine: "0.33.0")  # no test has run it
    with pytest.raises(UnsupportedEngineVersion, match=r"not 0\.33\.0"):
        check_version("vllm")
    monkeypatch.setattr(compat, "installed_version", lambda engine: "0.5.6")
    assert check_version("lmcache") == "0.5.6"


def test_the_accepted_releases_are_the_releases_the_integration_tests_install() -> None:
    """`TESTED_VERSIONS` may accept only what scripts/integration_venvs.sh pins (and CI runs)."""
    import re
    from pathlib import Path

    from sage_eviction.integrations.compat import TESTED_VERSIONS

    script = (Path(__file__).resolve().parents[1] / "scripts" / "integration_venvs.sh").read_text()
    pinned = dict(re.findall(r'PINS=\("([a-z-]+)==([0-9.]+)"\)', script))
    for engine, (dists, prefixes) in TESTED_VERSIONS.items():
        versions = [pinned[d] for d in dists if d in pinned]
        assert versions, f"{engine}: no venv of scripts/integration_venvs.sh installs {dists}"
        for prefix in prefixes:
            assert any(v == prefix or v.startswith(prefix) for v in versions), (
                f"{engine} {prefix}x is accepted but the integration venv installs {versions}"
            )
