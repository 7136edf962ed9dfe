"""Key tables from a framework's own classes (dataclass fields, pydantic models, argparse flags): each key's type,
choices and default, as tables/*.json stores them; and the one error a framework's refusal becomes."""
from __future__ import annotations

import dataclasses
import enum
import json
import os
import types
import typing

class ValidationFailed(Exception):
    """The framework's own code refused the config; the message is the framework's."""


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        if isinstance(value, enum.Enum):
            return value.value
        if isinstance(value, tuple):
            return [_jsonable(v) for v in value]
        return None


def _kind(tp) -> dict:
    """A field's annotation -> {"type": int|float|bool|str|list|dict|any, "choices": [...]}."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        kinds = [_kind(a) for a in args if a is not type(None)]
        types_ = {k["type"] for k in kinds}
        if len(kinds) == 1:
            return kinds[0]
        if types_ == {"int", "float"}:
            return {"type": "float"}
        return {"type": "any"}
    if origin is typing.Literal:
        return {"type": "str", "choices": [_jsonable(a) for a in args]}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"type": "str", "choices": [m.value for m in tp]}
    if tp is bool:
        return {"type": "bool"}
    if tp is int:
        return {"type": "int"}
    if tp is float:
        return {"type": "float"}
    if tp is str or (isinstance(tp, type) and issubclass(tp, os.PathLike)):
        return {"type": "str"}
    if origin in (list, tuple) or tp in (list, tuple):
        return {"type": "list"}
    if origin is dict or tp is dict:
        return {"type": "dict"}
    return {"type": "any"}


def dataclass_table(cls) -> dict:
    hints = typing.get_type_hints(cls)
    table = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        spec = _kind(hints.get(f.name, typing.Any))
        if f.default is not dataclasses.MISSING:
            spec["default"] = _jsonable(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            spec["default"] = _jsonable(f.default_factory())
        table[f.name] = spec
    return dict(sorted(table.items()))


def pydantic_table(model) -> dict:
    table = {}
    for name, f in model.model_fields.items():
        spec = _kind(f.annotation)
        default = f.get_default(call_default_factory=True) if not f.is_required() else None
        spec["default"] = _jsonable(default)
        if (f.json_schema_extra or {}).get("deprecated"):
            spec["deprecated"] = True
        if hasattr(f.annotation, "model_fields") or any(hasattr(a, "model_fields") for a in typing.get_args(f.annotation)):
            spec = {"type": "dict"}
        table[f.alias or name] = spec
        if f.alias and f.alias != name:
            table[name] = dict(spec, alias_of=f.alias)
    return dict(sorted(table.items()))
