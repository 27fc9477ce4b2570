"""The small helpers the control API's OpenAPI document is built from (engine_adapter.serving.openapi)."""

from __future__ import annotations

from typing import Any

__all__ = ["BOOL", "INT", "MAP", "NUM", "STR", "Schema", "nullable", "obj", "ref"]

Schema = dict[str, Any]


def obj(
    required: dict[str, Schema], optional: dict[str, Schema] | None = None, *, extra: bool = True
) -> Schema:
    """An object schema with `required` properties (and `optional` ones)."""
    schema: Schema = {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": sorted(required),
    }
    if not extra:
        schema["additionalProperties"] = False
    return schema


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


INT: Schema = {"type": "integer"}
NUM: Schema = {"type": "number"}
STR: Schema = {"type": "string"}
BOOL: Schema = {"type": "boolean"}
MAP: Schema = {"type": "object"}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}
