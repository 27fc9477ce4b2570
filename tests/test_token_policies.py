"""The token policy registry and the contract every registered token policy passes.

Parametrized over `token_policy_names()`, so a policy is tested the day it is registered: it
builds by name with its defaults and knows its name; it keeps exactly the count it is asked for
(`kept_for_ratio`), as sorted cache indices that include what it promises to keep
(`always_kept`), with or without what its observer collected; `evict` leaves exactly those K/V
in the pool; it refuses unknown and ill-typed params with one error that lists its params. Then
the registry itself: names without torch, and a plugin registered through the entry-point group
``sage.token_policies`` that the engine serves (a real distribution on ``sys.path``, nothing
installed into the venv, as tests/test_registry.py does for block policies).

Which tokens a policy keeps is checked against kvpress in tests/test_token_eviction_kvpress.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import app_client, started_engine
from model_fixtures import one_thread_fixture

from engine_adapter.model import load_model
from engine_adapter.model.decoder import Decoder
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.config import ConfigError, resolve_config
from engine_adapter.token_eviction import KVCompression
from engine_adapter.token_eviction import registry as registry_module
from engine_adapter.token_eviction.generate import prefill
from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, kept_for_ratio
from engine_adapter.token_eviction.registry import (
    ENTRY_POINT_GROUP,
    TOKEN_POLICIES,
    TokenPolicyError,
    TokenPolicyParamError,
    UnknownTokenPolicyError,
    make_token_policy,
    token_policy_class,
    token_policy_names,
    token_policy_params,
)
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["one_thread_fixture"]

NAMES = token_policy_names()
PROMPT_LEN = 100  # above every default's min_length (snapkv's window is 64)
RATIOS = (0.25, 0.5, 0.9)


@pytest.fixture(scope="module")
def decoder() -> Decoder:
    model, _tokenizer, _config = load_model("sage-tiny", device="cpu")
    return model


def _prompt() -> list[int]:
    return torch.randint(3, 250, (PROMPT_LEN,), generator=torch.Generator().manual_seed(1)).tolist()


def _prefilled(decoder: Decoder, policy: TokenEvictionPolicy) -> SequenceKV:
    pool = decoder.make_pool(num_blocks=2 * PROMPT_LEN // 4, block_size=4)
    kv, _logits = prefill(decoder, pool, _prompt(), policy)
    return kv


# ---- the contract ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_builds_by_name_with_its_defaults_and_knows_its_name(name: str) -> None:
    policy = make_token_policy(name)
    assert isinstance(policy, TokenEvictionPolicy) and policy.name() == name
    assert type(policy) is token_policy_class(name)
    assert repr(policy).startswith(type(policy).__name__)
    assert type(policy).__doc__, f"{name}: the class says what it keeps"
    # params() are constructor params (a budget wrapper's: its own and its press's): building
    # from them gives the same policy
    known = set(token_policy_params(type(policy)))
    if policy.wraps_press:
        known |= set(token_policy_params(token_policy_class(policy.default_press)))
    assert set(policy.params()) <= known
    assert make_token_policy(name, **policy.params()).params() == policy.params()


@pytest.mark.parametrize("observed", [True, False], ids=["observed", "not-observed"])
@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("name", NAMES)
def test_keeps_the_count_asked_sorted_with_its_protected_tokens(
    decoder: Decoder, one_thread: None, name: str, ratio: float, observed: bool
) -> None:
    """`observed` False: a sequence admitted before the policy was swapped in (no observer)."""
    policy = make_token_policy(name)
    kv = _prefilled(decoder, policy if observed else make_token_policy("none"))
    n_keep = kept_for_ratio(PROMPT_LEN, ratio)
    protected = policy.always_kept(PROMPT_LEN, n_keep)
    assert all(0 <= i < PROMPT_LEN for i in protected)
    if not policy.should_evict(kv, 0):  # a policy that never evicts keeps everything
        assert policy.evict(kv, n_keep) == 0 and kv.length == PROMPT_LEN
        assert set(protected) <= set(range(PROMPT_LEN))
        return
    policy.ratio = ratio  # as `evict(..., ratio=ratio)` sets it
    keep, counts = policy.select(kv, n_keep)
    policy.ratio = None
    layers, kv_heads = decoder.config.num_hidden_layers, decoder.config.num_key_value_heads
    width = keep.shape[-1]
    if counts is None:  # the same budget everywhere: exactly the count asked
        assert keep.shape == (layers, kv_heads, n_keep)
        counts = torch.full((layers, kv_heads), n_keep)
    else:  # head-varying budgets (adakv, pyramid): the count asked on average, give or take
        # pyramid's rounding of each layer's budget (kvpress's rule)
        assert keep.shape[:2] == (layers, kv_heads) and int(counts.max()) == width
        assert abs(float(counts.float().mean()) - n_keep) <= 1.0
    rows = [keep[la, h, : counts[la, h]] for la in range(layers) for h in range(kv_heads)]
    assert all(bool((row.diff() > 0).all()) for row in rows), "kept indices are strictly ascending"
    assert int(keep.min()) >= 0 and int(keep.max()) < PROMPT_LEN
    for row in rows:
        assert set(protected) <= set(row.tolist()), f"{name} dropped a token it always keeps"
    before = [(kv.keys(layer), kv.values(layer)) for layer in range(layers)]
    assert policy.evict(kv, n_keep, ratio=ratio) == PROMPT_LEN - width
    assert kv.length == width
    for layer, (keys, values) in enumerate(before):
        for h in range(kv_heads):
            n, kept = int(counts[layer, h]), keep[layer, h, : counts[layer, h]]
            got_k, got_v = kv.keys(layer)[h, :n], kv.values(layer)[h, :n]
            assert torch.equal(got_k, keys[h, kept]) and torch.equal(got_v, values[h, kept]), (
                f"{name}: the pool holds other K/V than the kept ones"
            )
            if kv.key_mask is not None:
                assert kv.key_mask[layer, h].tolist() == [j < n for j in range(width)]


@pytest.mark.parametrize("name", NAMES)
def test_memory_pressure_target_is_at_most_the_managers(name: str) -> None:
    policy = make_token_policy(name)
    for length, target in ((PROMPT_LEN, 50), (10_000, 5_000), (3, 1)):
        assert 1 <= policy.target_len(length, target) <= target


@pytest.mark.parametrize("name", NAMES)
def test_refuses_an_unknown_param_and_lists_its_params(name: str) -> None:
    cls = token_policy_class(name)
    params = token_policy_params(cls)
    if cls.wraps_press:  # the error names the press and lists the wrapper's params after it
        params["press"] = cls.default_press
    listing = ", ".join(f"{k}={v!r}" for k, v in params.items()) or "none"
    with pytest.raises(TokenPolicyParamError, match="no param 'no_such_param'") as caught:
        make_token_policy(name, no_such_param=1)
    assert caught.value.args[0].endswith(f"params: {listing}")


@pytest.mark.parametrize(
    ("name", "param"),
    [
        (name, param)
        for name in NAMES
        for param, default in token_policy_params(token_policy_class(name)).items()
        if isinstance(default, int) and not isinstance(default, bool)
    ],
)
@pytest.mark.parametrize("value", [-1, "8", 8.0, True])
def test_refuses_a_bad_count(name: str, param: str, value: object) -> None:
    """Every int param of a token policy is a count of tokens: negative or not an int is refused."""
    with pytest.raises(TokenPolicyParamError, match=param):
        make_token_policy(name, **{param: value})


# ---- the registry ------------------------------------------------------------------------------


def test_built_ins_are_one_file_each_under_presses() -> None:
    for name, path in TOKEN_POLICIES.items():
        module, _, class_name = path.partition(":")
        assert module == f"engine_adapter.token_eviction.presses.{name}"
        cls = token_policy_class(name)
        assert (cls.__module__, cls.__name__) == (module, class_name)
        doc = sys.modules[module].__doc__ or ""
        assert doc.startswith(f"`{name}`:"), f"{module}'s docstring starts with the policy's name"


def test_an_unknown_name_lists_the_names() -> None:
    for build in (make_token_policy, token_policy_class):
        with pytest.raises(UnknownTokenPolicyError, match="none, sliding, snapkv, h2o, tova"):
            build("lru")
    assert issubclass(UnknownTokenPolicyError, TokenPolicyError)
    assert issubclass(TokenPolicyParamError, TokenPolicyError) and issubclass(TokenPolicyError, ValueError)
    with pytest.raises(UnknownTokenPolicyError, match="sliding, snapkv, h2o, tova"):
        KVCompression("lru", 0.5)


def test_the_engine_window_goes_to_the_windowed_policy_only() -> None:
    assert make_token_policy("sliding", window=16).params()["window_size"] == 16
    assert make_token_policy("snapkv", window=16).params()["observation_window"] == 64
    assert make_token_policy("sliding", window_size=8).params()["window_size"] == 8
    with pytest.raises(TokenPolicyParamError, match="window_size is the eviction window"):
        make_token_policy("sliding", window=16, window_size=8)


def test_names_and_checks_need_no_torch() -> None:
    """The config and the request parser check names before any model loads."""
    probe = """
import json, sys
from engine_adapter.token_eviction import KVCompression
from engine_adapter.serving.config import resolve_config
from engine_adapter.token_eviction.registry import token_policy_names
KVCompression("snapkv", 0.5)
token = resolve_config({"token_eviction": "tova"}, environ={}).token_eviction
print(json.dumps([token_policy_names(), token, "torch" in sys.modules]))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [NAMES, "tova", False]


# ---- entry-point plugins -------------------------------------------------------------------------

PLUGIN_NAME = "sagetesttoken"
PLUGIN_MODULE = "sage_test_token_plugin"


@pytest.fixture
def plugin_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A real installed distribution on sys.path whose entry point registers `PLUGIN_NAME`."""
    (tmp_path / f"{PLUGIN_MODULE}.py").write_text(
        textwrap.dedent(
            f"""
            import torch

            from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, recency_scores

            class NewestTokensPolicy(TokenEvictionPolicy):
                '''Keeps the newest tokens after `n_first` first ones (a test plugin).'''

                def __init__(self, n_first: int = 2) -> None:
                    if n_first < 0:
                        raise ValueError("n_first must be >= 0")
                    self.n_first = n_first

                def name(self) -> str:
                    return "{PLUGIN_NAME}"

                def always_kept(self, length: int, target_len: int) -> list[int]:
                    return [length - 1]

                def scores(self, cache, layer: int, target_len: int) -> torch.Tensor:
                    scores = recency_scores(cache.num_kv_heads, cache.length)
                    scores[:, : self.n_first] = cache.length
                    return scores

                def params(self) -> dict[str, int]:
                    return {{"n_first": self.n_first}}

            NOT_A_POLICY = 42
            """
        )
    )
    dist_info = tmp_path / "sage_test_token_plugin-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: sage-test-token-plugin\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n{PLUGIN_NAME} = {PLUGIN_MODULE}:NewestTokensPolicy\n"
        f"snapkv = {PLUGIN_MODULE}:NewestTokensPolicy\n"  # a built-in name is not taken over
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # also invalidates importlib's caches
    monkeypatch.setattr(registry_module, "_plugins", None)  # read the entry points again
    try:
        yield dist_info
    finally:
        sys.modules.pop(PLUGIN_MODULE, None)
    # monkeypatch restores the plugins read before and sys.path after this


def test_an_entry_point_plugin_is_listed_built_and_checked(plugin_distribution: Path) -> None:
    assert token_policy_names() == [*TOKEN_POLICIES, PLUGIN_NAME]
    policy = make_token_policy(PLUGIN_NAME, n_first=3)
    assert type(policy).__name__ == "NewestTokensPolicy" and policy.params() == {"n_first": 3}
    assert type(make_token_policy("snapkv")).__name__ == "SnapKVPolicy"
    with pytest.raises(TokenPolicyParamError, match="n_first=2"):
        make_token_policy(PLUGIN_NAME, n_frist=3)
    assert KVCompression(PLUGIN_NAME, 0.5).policy == PLUGIN_NAME
    assert resolve_config({"token_eviction": PLUGIN_NAME}, environ={}).token_eviction == PLUGIN_NAME
    with pytest.raises(ConfigError, match=f"adakv, pyramid, {PLUGIN_NAME}"):
        resolve_config({"token_eviction": "lru"}, environ={})


def test_an_entry_point_plugin_is_served(plugin_distribution: Path, one_thread: None) -> None:
    """The engine compresses a request's prompt with the plugin, takes it as its token policy
    by hot swap, and the HTTP API accepts its name in ``kv_compression``."""
    engine = started_engine(num_blocks=256)
    try:
        request = KVCompression(PLUGIN_NAME, 0.5)
        result = engine.submit(
            "x" * 47, SamplingParams(max_tokens=2, ignore_eos=True), kv_compression=request
        )
        assert result.result(60).finish_reason == "length"
        [event] = [e for e in engine.eviction_events(1000) if e["event"] == "compress"]
        assert event["policy"] == PLUGIN_NAME and event["tokens_after"] == kept_for_ratio(48, 0.5)
        swapped = engine.set_token_policy(PLUGIN_NAME)
        assert (swapped["new"], swapped["params"]) == (PLUGIN_NAME, {"n_first": 2})
        client = app_client(engine)
        body: dict[str, Any] = {"prompt": "y" * 40, "max_tokens": 1}
        answer = client.post(
            "/v1/completions", json={**body, "kv_compression": {"policy": PLUGIN_NAME, "ratio": 0.5}}
        )
        assert answer.status_code == 200, answer.text
        assert client.get("/v1/eviction/token").json()["policy"] == PLUGIN_NAME
        engine.cache.check_invariants()
    finally:
        engine.shutdown(drain=False, timeout=10)


def test_an_entry_point_that_is_not_a_policy_is_an_error(plugin_distribution: Path) -> None:
    (plugin_distribution / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n{PLUGIN_NAME} = {PLUGIN_MODULE}:NOT_A_POLICY\n"
    )
    assert PLUGIN_NAME in token_policy_names()  # listed by name, without importing it
    with pytest.raises(UnknownTokenPolicyError, match="not a TokenEvictionPolicy subclass"):
        make_token_policy(PLUGIN_NAME)


def test_plugin_registration_was_undone() -> None:
    """Runs after the plugin tests in file order: nothing of the plugin is left behind."""
    assert token_policy_names() == list(TOKEN_POLICIES)
    with pytest.raises(UnknownTokenPolicyError):
        token_policy_class(PLUGIN_NAME)
