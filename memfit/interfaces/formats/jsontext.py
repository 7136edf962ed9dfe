"""JSON read with one-line errors, and JSON written by editing the original text in place.

Rewriting a file with `json.dumps` would turn `5e8` into `500000000.0` and reflow every line; the
editor here changes only the values that changed, so `diff` shows just those lines.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from memfit.errors import MemfitError


def load(text: str, where: str):
    """Parse JSON; duplicate keys are an error, as DeepSpeed's own loader makes them."""

    def no_duplicates(pairs):
        seen = {}
        for key, value in pairs:
            if key in seen:
                raise MemfitError(f"{where}: {key}: duplicate key (DeepSpeed and json readers disagree on which wins)")
            seen[key] = value
        return seen

    try:
        return json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as e:
        raise MemfitError(f"{where}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except MemfitError:  # a duplicate key (a ValueError too)
        raise
    except RecursionError:
        raise MemfitError(f"{where}: not valid JSON for a config: nested too deeply") from None
    except ValueError:  # int() refuses a number of more than 4300 digits
        raise MemfitError(f"{where}: not valid JSON for a config: a number with thousands of digits") from None


# --- a small JSON parser that remembers where each value sits in the text ----------------------------

@dataclass
class Node:
    start: int
    end: int
    members: list = field(default_factory=list)  # objects: [(key, key_start, Node)]
    is_object: bool = False


_WS = re.compile(r"\s*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_SCALAR = re.compile(r"-?[0-9][0-9.eE+-]*|true|false|null|-?Infinity|NaN")


def _at(pattern: re.Pattern[str], text: str, i: int) -> re.Match[str]:
    """`pattern` at `i` of a text json.loads accepted: where the parser below expects a token, one is there."""
    m = pattern.match(text, i)
    if m is None:
        raise MemfitError(f"JSON text: no {pattern.pattern!r} at offset {i} (the text changed after it was read)")
    return m


def _skip(text: str, i: int) -> int:
    return _at(_WS, text, i).end()


def _parse(text: str, i: int) -> Node:
    i = _skip(text, i)
    c = text[i]
    if c == "{":
        node = Node(i, i, is_object=True)
        i = _skip(text, i + 1)
        while text[i] != "}":
            m = _at(_STRING, text, i)
            key = json.loads(m.group())
            value = _parse(text, _skip(text, m.end()) + 1)  # past the colon
            node.members.append((key, i, value))
            i = _skip(text, value.end)
            if text[i] == ",":
                i = _skip(text, i + 1)
        node.end = i + 1
        return node
    if c == "[":
        node = Node(i, i)
        i = _skip(text, i + 1)
        while text[i] != "]":
            item = _parse(text, i)
            node.members.append((None, item.start, item))
            i = _skip(text, item.end)
            if text[i] == ",":
                i = _skip(text, i + 1)
        node.end = i + 1
        return node
    m = _at(_STRING if c == '"' else _SCALAR, text, i)
    return Node(i, m.end())


def _line_indent(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    line = text[start:]
    return line[:len(line) - len(line.lstrip(" \t"))]


def _indent_unit(text: str, root: Node) -> str:
    if root.is_object and root.members:
        first = _line_indent(text, root.members[0][1])
        return first or " "
    return "  "


def _dump(value, indent: str | None, unit: str) -> str:
    if indent is None:  # a one-line document stays on one line
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, indent=unit, ensure_ascii=False).replace("\n", "\n" + indent)


def edit(text: str, old, new, where: str) -> str:
    """Return `text` changed from document `old` to document `new`, touching only what differs."""
    from memfit.interfaces.formats.base import same

    root = _parse(text, 0)
    unit = _indent_unit(text, root)
    edits: list[tuple[int, int, str]] = []

    def walk(node: Node, old_v, new_v):
        if not (isinstance(old_v, dict) and isinstance(new_v, dict) and node.is_object):
            if not same(old_v, new_v):
                indent = _line_indent(text, node.start) if "\n" in text else None
                edits.append((node.start, node.end, _dump(new_v, indent, unit)))
            return
        members = node.members
        kept = [m for m in members if m[0] in new_v]
        added = [k for k in new_v if k not in old_v]
        multiline = "\n" in text[node.start:node.end]
        if not kept and (added or members):  # rewrite the whole inside of the braces
            indent = _line_indent(text, node.start)
            if added:
                inner = indent + unit if multiline or not members else None
                parts = [f"{json.dumps(k)}: {_dump(new_v[k], inner, unit)}" for k in added]
                body = ("\n" + inner + (",\n" + inner).join(parts) + "\n" + indent) if inner else ", ".join(parts)
            else:
                body = ""
            edits.append((node.start + 1, node.end - 1, body))
            return
        last_kept = max(i for i, m in enumerate(members) if m[0] in new_v)
        for idx, (key, key_start, child) in enumerate(members):
            if key in new_v:
                walk(child, old_v[key], new_v[key])
            elif idx < last_kept:  # delete the member and the comma after it
                edits.append((key_start, members[idx + 1][1], ""))
        if last_kept + 1 < len(members):  # trailing members: delete them and the comma before them
            edits.append((members[last_kept][2].end, members[-1][2].end, ""))
        if added:
            indent = _line_indent(text, kept[-1][1]) if multiline else None
            sep = (",\n" + indent) if indent is not None else ", "
            parts = [f"{json.dumps(k)}: {_dump(new_v[k], indent, unit)}" for k in added]
            edits.append((kept[-1][2].end, kept[-1][2].end, sep + sep.join(parts)))

    walk(root, old, new)
    out = text
    for start, end, replacement in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        out = out[:start] + replacement + out[end:]
    if not same(load(out, where), new):  # the editor's own check: never hand back a wrong file
        raise MemfitError(f"{where}: internal error: the edited JSON does not read back as intended")
    return out
