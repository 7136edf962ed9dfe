"""Key tables of each framework, derived from its own code by `memfit.interfaces.formats.validate.write_tables`.

They let the core reject unknown keys and wrong types the way the framework would, without
importing it. tests/formats/test_validate.py proves each table matches the installed framework.
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path

HERE = Path(__file__).parent / "tables"


@cache
def table(name: str) -> dict:
    return json.loads((HERE / f"{name}.json").read_text())


def check_type(where: str, key: str, value, spec: dict) -> None:
    """Reject a value of the wrong type for a table entry (None is always allowed: it means unset)."""
    from memfit.interfaces.formats.base import as_bool, as_float, as_int, bad, shown

    kind = spec.get("type", "any")
    if value is None or kind == "any":
        return
    if kind == "int":
        as_int(where, key, value)
    elif kind == "float":
        as_float(where, key, value)
    elif kind == "bool":
        as_bool(where, key, value)
    elif kind == "str":
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise bad(where, key, f"expected a string, got {shown(value)}")
        if "choices" in spec and value not in spec["choices"]:
            raise bad(where, key, f"expected one of {', '.join(map(str, spec['choices']))}; got {shown(value)}")
    elif kind == "list" and not isinstance(value, (list, str)):
        raise bad(where, key, f"expected a list, got {shown(value)}")
    elif kind == "dict" and not isinstance(value, (dict, str)):
        raise bad(where, key, f"expected a mapping, got {shown(value)}")
