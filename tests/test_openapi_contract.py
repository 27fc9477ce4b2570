"""The control API against its OpenAPI document: schemathesis drives a live engine over its socket.

Every operation gets generated requests, drawn from its own schema (the document's examples
first, then bodies and queries that fit it, then ones that break it); no answer may be a 5xx or
stray from the document (status, content type, schema), every operation must get 2xx answers
(a fuzz that only ever hits validation tests nothing past it), and the engine must still serve
afterwards. The only change made to a drawn request is to cap a completion's ``max_tokens`` (a
CPU run cannot wait for millions of tokens), and to give a chat without one ``max_tokens: 8``
(it would generate to the end of its context); no other field is ever added. The document served at
``/openapi.json`` is the one checked in at ``docs/openapi.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine_adapter.serving.openapi import openapi_document

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DOCUMENT = openapi_document()
SCHEMA = schemathesis.openapi.from_dict(DOCUMENT)
# Draining the engine ends the run: it is called once, last, by its own test.
FUZZED = SCHEMA.exclude(path="/v1/engine/shutdown")
# Operations whose bodies carry max_tokens: the only field the fuzz ever changes.
GENERATING = ("/v1/completions", "/v1/chat/completions", "/v1/messages")
# Statuses answered to the fuzz, by operation ("PUT /v1/eviction/policy").
ANSWERS: dict[str, Counter[int]] = {}


def test_the_checked_in_document_is_the_served_one() -> None:
    committed = json.loads((REPO / "docs" / "openapi.json").read_text(encoding="utf-8"))
    assert committed == DOCUMENT, "regenerate: python -m engine_adapter.serving.openapi > docs/openapi.json"
    assert DOCUMENT["openapi"] == "3.1.0"


@pytest.fixture(scope="module")
def engine_socket() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="sg-oa-", dir="/tmp"))
    sock = folder / "e.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    env.update(SAGE_HOME=str(folder / "home"), PYTHONPATH=str(REPO))
    args = ["llm", "engine", "start", "sage-tiny", "--num-blocks", "64", "--device", "cpu", "--detach"]
    args += ["--socket", str(sock), "--max-num-seqs", "8"]
    started = subprocess.run(
        [sys.executable, "-m", "sage_cli.app", *args], env=env, capture_output=True, text=True
    )
    assert started.returncode == 0, started.stderr
    yield sock
    subprocess.run(
        [sys.executable, "-m", "sage_cli.app", "llm", "engine", "stop", "--socket", str(sock)], env=env
    )
    shutil.rmtree(folder, ignore_errors=True)


def send(sock: Path, case: Any) -> httpx.Response:
    kwargs = case.as_transport_kwargs(base_url="http://sage")
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=60) as client:
        return client.request(
            kwargs["method"],
            kwargs["url"],
            params=kwargs.get("params"),
            headers=kwargs.get("headers"),
            json=kwargs.get("json"),
            content=kwargs.get("data"),
        )


def bounded(case: Any) -> bool:
    """Whether `case` ends on a CPU: a follow stream never does, so it is left out; a completion
    of millions of tokens would outlast the run, so its ``max_tokens`` is capped at 8 (the
    engine takes such requests; they are just long). A chat without one generates to the end of
    the context (issue 48: OpenAI's default), as long: it gets ``max_tokens: 8`` too. Nothing
    else is added to a body."""
    query = case.query or {}
    if str(query.get("follow", "")).lower() in ("true", "1"):
        return False
    if case.path in GENERATING and isinstance(case.body, dict):
        for field in ("max_tokens", "max_completion_tokens"):
            value = case.body.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and value > 8:
                case.body[field] = 8
        unbounded = all(case.body.get(f) is None for f in ("max_tokens", "max_completion_tokens"))
        if case.path == "/v1/chat/completions" and unbounded:
            case.body["max_tokens"] = 8
    return True


def _operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


def _label(operation: Any) -> str:
    return f"{operation.method.upper()} {operation.path}"


def _strategies(operation: Any) -> list[tuple[Any, bool]]:
    """(cases, positive): the document's own examples, schema-valid cases and, where the schema
    can be broken, schema-violating ones (as schemathesis' own runner draws them: its examples,
    then its fuzzing phase). The examples make each operation reach the engine at least once
    whatever the fuzz draws: PUT /v1/eviction/token's policy is one of the names or any string,
    and 25 drawn strings can all miss the names."""
    from schemathesis.generation import GenerationMode

    examples = [(cases, True) for cases in operation.schema.get_strategies_from_examples(operation)]
    return [
        *examples,
        (operation.as_strategy(GenerationMode.POSITIVE), True),
        (operation.as_strategy(GenerationMode.NEGATIVE), False),
    ]


# One test per operation, by its own id: schemathesis' own parametrize gives every operation the
# same node id, which pytest-xdist (the full run) collapses to one.
@pytest.mark.slow
@pytest.mark.parametrize("operation", _operations(FUZZED), ids=_label)
def test_every_operation_keeps_to_the_document(operation: Any, engine_socket: Path) -> None:
    for cases, positive in _strategies(operation):
        _fuzz(engine_socket, cases, positive)


def _fuzz(engine_socket: Path, cases: Any, positive: bool) -> None:
    """Send the drawn cases; record the answers to schema-valid ones (`positive`)."""

    @given(case=cases)
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    def check(case: Any) -> None:
        if not bounded(case):
            return
        response = send(engine_socket, case)
        # the answers to schema-valid cases of the operation itself (not a probe of another method)
        if positive and case.method.upper() == case.operation.method.upper():
            ANSWERS.setdefault(_label(case.operation), Counter())[response.status_code] += 1
        assert response.status_code < 500, (case.method, case.path, response.text[:300])
        # Not positive_data_acceptance: a schema cannot say every rule of the API (token ids
        # within the model's vocabulary, a prompt within the pool), so a 400 to a schema-valid
        # request is allowed; a schema-violating one must still be refused
        # (negative_data_rejection).
        case.validate_response(response, excluded_checks=[schemathesis.checks.positive_data_acceptance])

    try:
        check()
    except Unsatisfiable:
        if positive:
            raise
        # an operation with nothing to violate (no parameters, no body): no negative case exists


@pytest.mark.slow
def test_every_operation_got_past_validation(engine_socket: Path) -> None:
    """Each fuzzed operation was answered 2xx at least once: the fuzz reached the engine."""
    operations = {_label(o) for o in _operations(FUZZED)}
    assert ANSWERS, "run with test_every_operation_keeps_to_the_document (it records the answers)"
    missing = {op: dict(ANSWERS.get(op, {})) for op in operations if not _ok(ANSWERS.get(op, Counter()))}
    assert not missing, f"operations never answered 2xx (status: count): {missing}"


def _ok(statuses: Counter[int]) -> bool:
    return any(200 <= status < 300 for status in statuses)


@pytest.mark.slow
def test_the_engine_still_serves_and_drains_by_the_document(engine_socket: Path) -> None:
    with httpx.Client(
        transport=httpx.HTTPTransport(uds=str(engine_socket)), base_url="http://sage"
    ) as client:
        answer = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert client.get("/openapi.json").json() == DOCUMENT
    shutdown = SCHEMA["/v1/engine/shutdown"]["POST"].Case()
    response = send(engine_socket, shutdown)
    assert response.status_code == 200
    shutdown.validate_response(response)
