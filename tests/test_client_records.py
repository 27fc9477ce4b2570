"""`sage_cli.records` stays the control API's contract: each record's fields are the properties
of the schema docs/openapi.json gives its answer (required ones required), an answer parses into
its nested records, and an answer that lacks a required field is a protocol error, not a
half-filled record. (tests/test_examples.py parses a live engine's answers through
examples/live_engine.py.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from sage_cli import records
from sage_cli.client import ControlClient, EngineProtocolError

OPENAPI = json.loads((Path(__file__).resolve().parents[1] / "docs" / "openapi.json").read_text())
SCHEMAS = OPENAPI["components"]["schemas"]


def _response(path: str, method: str) -> dict[str, Any]:
    schema: dict[str, Any] = OPENAPI["paths"][path][method]["responses"]["200"]["content"][
        "application/json"
    ]["schema"]
    return schema


CONTRACT = {
    records.EvictionStats: SCHEMAS["EvictionStats"],
    records.TierStats: SCHEMAS["TierStats"],
    records.TokenEviction: SCHEMAS["TokenEviction"],
    records.Policy: SCHEMAS["Policy"],
    records.CacheUsage: SCHEMAS["CacheUsage"],
    records.EngineInfo: SCHEMAS["Engine"],
    records.Policies: _response("/v1/eviction/policies", "get"),
    records.PolicySwap: _response("/v1/eviction/policy", "put"),
}


@pytest.mark.parametrize("record", list(CONTRACT), ids=lambda r: r.__name__)
def test_each_record_has_its_schemas_fields(record: type[Any]) -> None:
    schema = CONTRACT[record]
    fields = {f.name for f in dataclasses.fields(record)} - {"raw"}
    assert fields == set(schema["properties"])
    assert set(record.required) == set(schema.get("required", []))
    for f in dataclasses.fields(record):  # an optional field has a default, a required one none
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        assert has_default == (f.name not in record.required or f.name == "raw"), f.name


def _tier(name: str) -> dict[str, Any]:
    return {
        key: (name if key == "tier" else "lru" if key == "policy" else 1)
        for key in records.TierStats.required
    }


def test_an_answer_parses_into_its_nested_records_and_keeps_the_rest() -> None:
    answer = {key: 0 for key in records.EvictionStats.required}
    answer.update(policy="lru", hit_rate=0.5, evictions_by_policy={"lru": 3}, evictions_by_reason={})
    answer.update(tiers=[_tier("host"), _tier("disk")], strategy="LRU", token_eviction=None)
    stats = records.EvictionStats.from_json(answer)
    assert stats.hit_rate == 0.5 and stats.evictions_by_policy == {"lru": 3}
    assert [t.tier for t in stats.tiers] == ["host", "disk"] and stats.tiers[0].policy == "lru"
    assert stats.raw["strategy"] == "LRU" and stats.regret_ratio is None  # beyond the schema: raw


class _Answers(ControlClient):
    """A client whose engine answers `answer` to every JSON call (the typed layer's input)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__("/nonexistent.sock")
        self.answer = answer

    def eviction_stats(self) -> dict[str, Any]:
        return self.answer


def test_a_missing_required_field_is_a_protocol_error() -> None:
    answer = {key: 0 for key in records.EvictionStats.required if key != "hit_rate"}
    with pytest.raises(records.RecordError, match="lacks hit_rate"):
        records.EvictionStats.from_json(answer)
    with pytest.raises(EngineProtocolError, match="EvictionStats: the answer lacks hit_rate"):
        _Answers(answer).stats()
