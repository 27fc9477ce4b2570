"""What routers call on a sage engine (engine_adapter.serving.worker_routes): SGLang's worker
metadata, load and flush routes answer from the engine's real state, the routers' extension
fields pass at their neutral value and are refused at any other, and an engine started with
``kv_events_endpoint`` publishes its cache on ZMQ as it serves. The tests on an engine are slow
(one sage-tiny engine for the module, each chat a real forward pass)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_fixtures import app_client, running_engine
from starlette.testclient import TestClient

from engine_adapter.cache.block_keys import format_block_key
from engine_adapter.serving.config import ConfigError, EngineConfig
from engine_adapter.serving.engine import Engine
from engine_adapter.serving.kv_events import KvEventView, decode_batch, hash_bytes
from engine_adapter.serving.requests import ApiError
from engine_adapter.serving.worker_routes import SGLANG_DEFAULTS, drop_router_defaults

zmq = pytest.importorskip("zmq")


def _config(root: Path, **extra: object) -> EngineConfig:
    return EngineConfig(
        device="cpu",
        block_size=4,
        num_blocks=256,
        name="routes",
        socket=str(root / "e.sock"),
        log_dir=str(root / "logs"),
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with running_engine(_config, "sage-routes-") as started:
        yield started


@pytest.fixture(scope="module")
def client(engine: Engine) -> TestClient:
    return app_client(engine)


def _chat(client: TestClient, **extra: object) -> dict[str, object]:
    body = {"messages": [{"role": "user", "content": "a prompt long enough to fill blocks"}], "max_tokens": 2}
    r = client.post("/v1/chat/completions", json={**body, **extra})
    assert r.status_code == 200, r.text
    answer: dict[str, object] = r.json()
    return answer


@pytest.mark.slow
def test_server_and_model_info_name_the_served_model_and_the_pool(client: TestClient, engine: Engine) -> None:
    for path in ("/server_info", "/get_server_info"):
        info = client.get(path).json()
        assert info["model_path"] == engine.config.model == info["served_model_name"]
        assert (info["page_size"], info["max_total_num_tokens"]) == (4, 256 * 4)
        assert (info["dp_size"], info["tp_size"]) == (1, 1)
    for path in ("/model_info", "/get_model_info"):
        model = client.get(path).json()
        assert model["model_path"] == engine.config.model and model["is_generation"] is True


@pytest.mark.slow
def test_flush_cache_resets_the_prefix_cache(client: TestClient, engine: Engine) -> None:
    _chat(client)
    assert engine.cache.num_cached_blocks > 0
    r = client.post("/flush_cache")
    assert r.status_code == 200 and r.json()["freed_blocks"] > 0
    assert engine.cache.num_cached_blocks == 0


@pytest.mark.slow
def test_get_load_counts_requests_and_the_tokens_they_hold(client: TestClient) -> None:
    _chat(client)  # finished: what it cached is evictable, not load
    load = client.get("/get_load").json()
    assert load == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]


@pytest.mark.slow
def test_a_router_s_neutral_extension_fields_pass_and_others_are_refused(client: TestClient) -> None:
    assert _chat(client, **SGLANG_DEFAULTS)["choices"]
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1, "skip_special_tokens": True})
    assert r.status_code == 200, r.text
    r = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "return_hidden_states": True},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "unsupported_field"
    assert "return_hidden_states" in r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "bogus": 1})
    assert r.status_code == 400 and r.json()["error"]["type"] == "unknown_field"


def test_drop_router_defaults_keeps_the_rest_and_accepts_null() -> None:
    body = {"messages": [], "skip_special_tokens": None, "no_stop_trim": False, "max_tokens": 3}
    assert drop_router_defaults(body, "w") == {"messages": [], "max_tokens": 3}
    with pytest.raises(ApiError):
        drop_router_defaults({"separate_reasoning": False}, "w")


@pytest.mark.parametrize(
    "endpoint", ["tcp://127.0.0.1", "udp://127.0.0.1:5", "tcp://h:0", "tcp://h:70000", "tcp://h:5 x"]
)
def test_a_bad_kv_events_endpoint_is_a_config_error(endpoint: str) -> None:
    with pytest.raises(ConfigError, match="kv_events_endpoint"):
        EngineConfig(kv_events_endpoint=endpoint)


def test_a_replay_endpoint_needs_the_events_endpoint() -> None:
    with pytest.raises(ConfigError, match="needs kv_events_endpoint"):
        EngineConfig(kv_events_replay_endpoint="tcp://127.0.0.1:5558")


def test_kv_events_are_refused_beside_compress_on_evict() -> None:
    # A dropped compressed prefix would leave its blocks in every router's view.
    with pytest.raises(ConfigError, match="does not run with compress_on_evict"):
        EngineConfig(kv_events_endpoint="tcp://127.0.0.1:5557", compress_on_evict="knorm:0.75")
    assert EngineConfig(compress_on_evict="knorm:0.75").kv_events_endpoint == ""


@pytest.mark.slow
def test_an_engine_publishes_its_cache_as_it_serves(tmp_path: Path) -> None:
    with zmq.Context() as ctx, ctx.socket(zmq.SUB) as sub:
        port = sub.bind_to_random_port("tcp://127.0.0.1")  # only to find a free port
        sub.unbind(sub.getsockopt_string(zmq.LAST_ENDPOINT))
        endpoint = f"tcp://127.0.0.1:{port}"
        with running_engine(lambda root: _config(root, kv_events_endpoint=endpoint), "sage-kvev-") as engine:
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(endpoint)
            client = app_client(engine)
            view = KvEventView()
            _chat(client)  # the subscription settles meanwhile: PUB drops what precedes it
            client.post("/flush_cache")
            for i in range(3):
                _chat(client, messages=[{"role": "user", "content": f"conversation {i} " * 6}])
            expected = {hash_bytes(format_block_key(b.key)) for b in engine.cache.radix.blocks()}
            assert expected
            while sub.poll(3000):
                _, _, payload = sub.recv_multipart()
                view.apply(decode_batch(payload)[1])
                if view.medium("GPU") == expected:
                    break
            assert view.medium("GPU") == expected
            assert engine.kv_events is not None and engine.kv_events.dropped == 0
