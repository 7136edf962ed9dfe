"""YAML read with a safe loader and one-line errors; YAML written by editing the original lines.

Training YAMLs are block mappings with comments (`### method`, `# choices: [...]`). The editor
changes, adds or removes only the lines of the keys that changed, keeps every comment and the key
order, and then re-reads its own output to prove it means what was intended.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from memfit.errors import MemfitError


# brackets opened in a row, past any real config's nesting: PyYAML would scan all of it before its recursion fails
TOO_DEEP = re.compile(r"(?:[\[{]\s*){200}")


def load(text: str, where: str) -> dict:
    if TOO_DEEP.search(text):
        raise MemfitError(f"{where}: not valid YAML for a config: nested too deeply")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise MemfitError(f"{where}: not valid YAML: {problem}{at}") from None
    except RecursionError:
        raise MemfitError(f"{where}: not valid YAML for a config: nested too deeply") from None
    except ValueError:  # int() refuses a number of more than 4300 digits
        raise MemfitError(f"{where}: not valid YAML for a config: a number with thousands of digits") from None
    if doc is None:
        raise MemfitError(f"{where}: the file is empty")
    if not isinstance(doc, dict):
        raise MemfitError(f"{where}: expected a mapping of `key: value` lines, got a {type(doc).__name__}")
    index(text, where)  # duplicate keys are an error, not "the last one wins"
    return doc


# --- where each key sits -------------------------------------------------------------------------------

_KEY = re.compile(r"^(?P<indent>[ ]*)(?P<key>[^\s#'\"][^:#]*?|'[^']*'|\"[^\"]*\")[ ]*:(?=\s|$)[ ]?(?P<rest>.*)$")


@dataclass
class Entry:
    path: tuple
    line: int  # index of the `key:` line
    indent: int
    value_start: int  # column where the inline value starts (== len(line) if none)
    value_end: int  # column where the inline value ends (before a comment)
    last: int  # index of the last line that belongs to this entry (its block)


def _comment_start(s: str) -> int:
    """Column of a trailing `# comment` in an inline value, or len(s)."""
    i, quote = 0, None
    if s[:1] in ("'", '"'):
        quote = s[0]
        i = 1
        while i < len(s):
            if s[i] == quote:
                if quote == "'" and s[i + 1:i + 2] == "'":
                    i += 2
                    continue
                break
            if quote == '"' and s[i] == "\\":
                i += 1
            i += 1
    m = re.search(r"(^|\s)#", s[i:])
    return i + m.start() + (1 if m and m.group(1) else 0) if m else len(s)


def _is_item(stripped: str) -> bool:
    return stripped == "-" or stripped.startswith("- ")


def index(text: str, where: str = "") -> dict[tuple, Entry]:
    """Where each mapping key sits. A block list (`- id: a` items, alignment-handbook's dataset_mixture) is the
    value of the key above it: its items' own keys repeat from item to item and are not indexed (the editor
    replaces a list whole)."""
    lines = text.split("\n")
    entries: dict[tuple, Entry] = {}
    stack: list[Entry] = []  # open mappings: their entries, by indent
    items_at = None  # the dash column of the block list being read
    for n, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped in ("---", "..."):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if items_at is not None and (indent > items_at or (indent == items_at and _is_item(stripped))):
            for parent in stack:  # inside a list item: part of the key that holds the list
                parent.last = n
            continue
        items_at = None
        if _is_item(stripped):
            # a list may sit at its key's own indent (`key:` then `- x` below it), so pop only deeper entries
            while stack and stack[-1].indent > indent:
                stack.pop()
            for parent in stack:
                parent.last = n
            items_at = indent
            continue
        while stack and stack[-1].indent >= indent:
            stack.pop()
        m = _KEY.match(line)
        if not m:  # a continuation line (a multi-line scalar, a list item): it belongs to the open entry
            if stack:
                stack[-1].last = n
            continue
        key = m.group("key").strip()
        if key[:1] in "'\"":
            key = key[1:-1]
        rest = m.group("rest")
        value_start = m.start("rest")
        value_end = value_start + len(rest[:_comment_start(rest)].rstrip())
        for parent in stack:
            parent.last = n
        path = tuple(e.path[-1] for e in stack) + (key,)
        if path in entries:
            raise MemfitError(f"{where}: {'.'.join(map(str, path))}: duplicate key (YAML readers keep only one)")
        entry = Entry(path, n, indent, value_start, value_end, n)
        entries[path] = entry
        stack.append(entry)
    return entries


# --- writing values ------------------------------------------------------------------------------------

def scalar(value) -> str:
    """A YAML scalar that `yaml.safe_load` reads back as exactly `value`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        s = repr(value)
        if "e" in s and "." not in s.split("e")[0]:  # PyYAML reads 1e-05 as a string; 1.0e-05 as a float
            mantissa, exp = s.split("e")
            s = f"{mantissa}.0e{exp if exp[0] in '+-' else '+' + exp}"
        return s
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{scalar(k)}: {scalar(v)}" for k, v in value.items()) + "}"
    s = str(value)
    plain_ok = (s and s.strip() == s and not re.search(r":\s|\s#|^[\[\]{}&*!|>'\"%@`,?:#-]", s)
                and _reads_as(s, s))
    if plain_ok:
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _reads_as(text: str, value) -> bool:
    try:
        return yaml.safe_load(text) == value and type(yaml.safe_load(text)) is type(value)
    except yaml.YAMLError:
        return False


def _block(key, value, indent: int, unit: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, dict) and value:
        out = [f"{pad}{scalar(key)}:"]
        for k, v in value.items():
            out += _block(k, v, indent + unit, unit)
        return out
    return [f"{pad}{scalar(key)}: {scalar(value)}"]


def _unit(entries: dict[tuple, Entry]) -> int:
    nested = sorted({e.indent for e in entries.values() if e.indent > 0})
    return nested[0] if nested else 2


def edit(text: str, old: dict, new: dict, where: str, anchors: dict[str, list[str]] | None = None) -> str:
    """Return `text` changed from document `old` to document `new`, touching only the lines that differ.

    `anchors` says where a new top-level key goes: after the first of the listed keys the file has
    (e.g. `deepspeed` after `finetuning_type`); otherwise at the end of its parent mapping.
    """
    from memfit.interfaces.formats.base import same

    lines = text.split("\n")
    entries = index(text, where)
    unit = _unit(entries)
    replace: dict[int, tuple[int, list[str]]] = {}  # first line -> (last line, new lines)
    inserts: dict[int, list[str]] = {}  # insert after this line

    def insert_after(line: int, new_lines: list[str]) -> None:
        inserts.setdefault(line, []).extend(new_lines)

    def walk(path: tuple, old_v: dict, new_v: dict, child_indent: int, parent_last: int) -> None:
        children = [entries[path + (k,)] for k in old_v if path + (k,) in entries]
        if children:
            child_indent = children[0].indent
        for key, value in old_v.items():
            e = entries.get(path + (key,))
            if e is None:
                raise MemfitError(f"{where}: internal error: cannot locate {key!r} in the text")
            if key not in new_v:
                replace[e.line] = (e.last, [])
            elif same(value, new_v[key]):
                continue
            elif isinstance(value, dict) and isinstance(new_v[key], dict) and value and new_v[key] and e.last > e.line:
                walk(path + (key,), value, new_v[key], e.indent + unit, e.last)
            elif e.last == e.line and not (isinstance(new_v[key], dict) and new_v[key]):
                line = lines[e.line]
                replace[e.line] = (e.line, [line[:e.value_start] + scalar(new_v[key]) + line[e.value_end:]])
            else:
                replace[e.line] = (e.last, _block(key, new_v[key], e.indent, unit))
        added = [k for k in new_v if k not in old_v]
        for key in added:
            where_line = parent_last
            for anchor in (anchors or {}).get(key, []) if not path else []:
                a = entries.get((anchor,))
                if a is not None and anchor in new_v:
                    where_line = a.last
                    break
            insert_after(where_line, _block(key, new_v[key], child_indent, unit))

    top_last = max((e.last for e in entries.values()), default=-1)
    walk((), old, new, 0, top_last)
    out: list[str] = []
    skip_until = -1
    if -1 in inserts:
        out += inserts[-1]
    for n, line in enumerate(lines):
        if n <= skip_until:
            pass
        elif n in replace:
            last, new_lines = replace[n]
            out += new_lines
            skip_until = last
        else:
            out.append(line)
        if n in inserts:  # after the line, or after what replaced it
            out += inserts[n]
    result = "\n".join(out)
    if not same(load(result, where), new):
        raise MemfitError(f"{where}: internal error: the edited YAML does not read back as intended")
    return result
