"""The package's types against the daemon's contract, supervisor/src/daemon/protocol.schema.json:
a field renamed, added, dropped or made nullable on one side and not the other fails here."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Literal

import pytest

import airlock_client
from airlock_client import errors
from airlock_client import types as T
from helpers import SCHEMA

ROOT: dict[str, Any] = json.loads(SCHEMA.read_text())

# Each record type and the schema object it mirrors, by JSON pointer.
MIRRORS: list[tuple[type[Any], str]] = [
    (T.CallResult, "/$defs/tool_result"),
    (T.ToolError, "/$defs/tool_error"),
    (T.Violation, "/$defs/tool_error/properties/violations/items"),
    (T.Usage, "/$defs/tool_result/properties/usage"),
    (T.Isolation, "/$defs/tool_result/properties/isolation"),
    (T.DenialReporting, "/$defs/tool_result/properties/isolation/properties/denial_reporting"),
    (T.Denial, "/$defs/tool_result/properties/denials/items"),
    (T.Limits, "/$defs/tool_result/properties/isolation/properties/limits"),
    (T.Network, "/$defs/tool_result/properties/network"),
    (T.NetworkEvent, "/$defs/tool_result/properties/network/properties/events/items"),
    (T.ToolListing, "/$defs/tool_listing"),
    (T.Approval, "/$defs/approval"),
    (T.DryRun, "/$defs/dry_run"),
    (T.Health, "/$defs/answers/properties/health/properties/result"),
    (T.Stats, "/$defs/answers/properties/stats/properties/result"),
    (T.StateChange, "/$defs/answers/properties/set_state/properties/result"),
    (T.SessionInfo, "/$defs/answers/properties/session_open/properties/result"),
    (T.SessionSettings, "/$defs/answers/properties/session_set/properties/result"),
    (
        T.Change,
        "/$defs/answers/properties/changes/properties/result/properties/changes/items",
    ),
]
IDS = [cls.__name__ for cls, _ in MIRRORS]


def at(pointer: str) -> dict[str, Any]:
    node: Any = ROOT
    for part in pointer.strip("/").split("/"):
        node = node[part]
    return typing.cast(dict[str, Any], node)


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    """Follows `$ref`s, and a `oneOf` of null and one object, to the object itself."""
    while True:
        if "$ref" in node:
            node = at(node["$ref"].removeprefix("#"))
        elif "oneOf" in node and len(node["oneOf"]) == 2 and {"type": "null"} in node["oneOf"]:
            node = next(n for n in node["oneOf"] if n != {"type": "null"})
        else:
            return node


def nullable(node: dict[str, Any]) -> bool:
    if "oneOf" in node:
        return any(nullable(n) for n in node["oneOf"])
    kind = node.get("type")
    return (
        kind == "null"
        or (isinstance(kind, list) and "null" in kind)
        or None in node.get("enum", [])
    )


def hints(cls: type[Any]) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def parts(hint: Any) -> list[Any]:
    """The members of a union (or the hint itself)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return list(typing.get_args(hint))
    return [hint]


@pytest.mark.parametrize(("cls", "pointer"), MIRRORS, ids=IDS)
def test_every_field_of_a_type_is_in_the_schema(cls: type[Any], pointer: str) -> None:
    properties = resolve(at(pointer))["properties"]
    extra = [f.name for f in dataclasses.fields(cls) if f.name not in properties]
    assert not extra, f"{cls.__name__} has fields the schema at {pointer} does not: {extra}"


@pytest.mark.parametrize(("cls", "pointer"), MIRRORS, ids=IDS)
def test_every_required_field_of_the_schema_is_in_the_type(cls: type[Any], pointer: str) -> None:
    node = resolve(at(pointer))
    fields = {f.name for f in dataclasses.fields(cls)}
    missing = [name for name in node.get("required", []) if name not in fields]
    assert not missing, f"{cls.__name__} lacks fields the schema at {pointer} requires: {missing}"


@pytest.mark.parametrize(("cls", "pointer"), MIRRORS, ids=IDS)
def test_every_optional_field_of_the_schema_is_in_the_type(cls: type[Any], pointer: str) -> None:
    # The types mirror whole objects, so a field the daemon adds is noticed too.
    node = resolve(at(pointer))
    fields = {f.name for f in dataclasses.fields(cls)}
    missing = [name for name in node["properties"] if name not in fields]
    assert not missing, f"{cls.__name__} lacks fields the schema at {pointer} has: {missing}"


@pytest.mark.parametrize(("cls", "pointer"), MIRRORS, ids=IDS)
def test_a_field_may_be_none_exactly_when_the_schema_lets_it_be_null_or_absent(
    cls: type[Any], pointer: str
) -> None:
    node = resolve(at(pointer))
    required = set(node.get("required", []))
    for name, hint in hints(cls).items():
        if hint is Any:
            continue  # any JSON value, null included
        spec = node["properties"][name]
        schema_says = nullable(spec) or name not in required
        type_says = type(None) in parts(hint)
        assert schema_says == type_says, (
            f"{cls.__name__}.{name}: the schema {'allows' if schema_says else 'forbids'} null "
            f"or absence, the type is {hint}"
        )


@pytest.mark.parametrize(("cls", "pointer"), MIRRORS, ids=IDS)
def test_enumerated_fields_have_the_schemas_values(cls: type[Any], pointer: str) -> None:
    node = resolve(at(pointer))
    for name, hint in hints(cls).items():
        literals = [p for p in parts(hint) if typing.get_origin(p) is Literal]
        spec = resolve(node["properties"][name])
        enum = spec.get("enum")
        if not literals:
            assert enum is None, f"{cls.__name__}.{name} is not a Literal of {enum}"
            continue
        (literal,) = literals
        assert enum is not None, f"{cls.__name__}.{name} is a Literal, the schema has no enum"
        assert set(typing.get_args(literal)) == {v for v in enum if v is not None}, (
            f"{cls.__name__}.{name}: {typing.get_args(literal)} against the schema's {enum}"
        )


@pytest.mark.parametrize(("cls", "pointer"), MIRRORS, ids=IDS)
def test_nested_records_mirror_the_nested_schema_objects(cls: type[Any], pointer: str) -> None:
    mirrors = {c: resolve(at(p)) for c, p in MIRRORS}
    node = resolve(at(pointer))
    for name, hint in hints(cls).items():
        for member in parts(hint):
            if typing.get_origin(member) is tuple:
                member = typing.get_args(member)[0]
                spec = resolve(resolve(node["properties"][name])["items"])
            else:
                spec = resolve(node["properties"][name])
            if dataclasses.is_dataclass(member):
                assert mirrors[typing.cast(type[Any], member)] is spec, (
                    f"{cls.__name__}.{name} is a {member}, which mirrors another schema object"
                )


def test_the_protocol_version_is_the_schemas() -> None:
    health = at("/$defs/answers/properties/health/properties/result")
    assert airlock_client.PROTOCOL_VERSION == health["properties"]["protocol_version"]["const"]


def test_the_request_refusals_are_the_schemas() -> None:
    kinds = at("/$defs/request_error")["properties"]["kind"]["enum"]
    assert set(errors._REFUSALS) == set(kinds)


def test_id_limits_are_the_schemas() -> None:
    assert airlock_client.MAX_ID_BYTES == at("/$defs/short_text")["maxLength"]


def test_the_exports_are_complete() -> None:
    for cls, _ in MIRRORS:
        assert getattr(airlock_client, cls.__name__) is cls
