"""Hydra overrides of a verl launch (`key=value`, `+key=value`, `++key=value`, `~key`) composed onto verl's default
config the way Hydra 1.3 does, without Hydra.

The defaults are tables/verl.json: every key of verl 0.9.1's composed `ppo_trainer` config with its raw value
(interpolations as written), derived in verl's venv by `python -m memfit.interfaces.formats.verl_compose table`
(tests/formats/test_verl.py fails when the installed verl composes otherwise). What is restated here of Hydra and
OmegaConf, checked against them by the same tests:
- the composed config is in struct mode: `key=value` of a key it lacks is refused ("Could not override ... To append
  to your config use +key=value"); `+key=value` of a key it has is refused ("Could not append to config. An item is
  already at ..."); `++key=value` sets or adds; `~key` deletes a key it has;
- values: null, true / false (any case), integers, floats (1e-6, inf), quoted strings, [lists] and {mappings} of
  those, `${...}` interpolations; anything else is the string as typed (trimmed);
- interpolations resolve when read: `${a.b}` absolute, `${.x}` beside the key (one more dot, one level up),
  `${oc.select:a.b,default}` the key's value or the default when the key is absent; text around `${...}` makes a string.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from memfit.interfaces.formats.base import bad, shown

MISSING = "???"  # OmegaConf's mandatory value: verl requires the launch to set it
_KEY = re.compile(r"[A-Za-z_][\w\-]*(?:\.[\w\-@/]+)*")
_INT = re.compile(r"[+-]?\d[\d_]*")
_FLOAT = re.compile(r"[+-]?(?:\d[\d_]*\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf|nan)", re.I)


@dataclass(frozen=True)
class Override:
    key: str
    op: str  # "set" (key=), "add" (+key=), "force" (++key=), "delete" (~key)
    value: object  # parsed (interpolations kept as their text); None for a bare ~key
    word: str  # the word as verl receives it


def parse_override(word: str, where: str) -> Override:
    """One Hydra override word; a malformed one is a one-line error naming it."""
    op, body = "set", word
    if body.startswith("++"):
        op, body = "force", body[2:]
    elif body.startswith("+"):
        op, body = "add", body[1:]
    elif body.startswith("~"):
        op, body = "delete", body[1:]
    key, eq, text = body.partition("=")
    key = key.strip()
    if not _KEY.fullmatch(key) or (not eq and op != "delete"):
        raise bad(where, word, "not a Hydra override: verl.trainer.main_ppo takes key=value, +key=value, "
                  "++key=value or ~key")
    value = parse_value(text, where, key) if eq else None
    return Override(key, op, value, word)


def parse_value(text: str, where: str, key: str):
    """A Hydra override value (the grammar subset in the module docstring)."""
    value, rest = _element(text.strip(), where, key)
    if rest.strip():
        raise bad(where, key, f"cannot read the value {shown(text)} (Hydra's override grammar)")
    return value


def _element(text: str, where: str, key: str):
    """(value, the text after it) for one element of a value: a list, a mapping, a quoted string or a primitive."""
    if text.startswith("["):
        return _sequence(text, "]", where, key)
    if text.startswith("{"):
        return _sequence(text, "}", where, key)
    if text[:1] in "'\"":
        end = text.find(text[0], 1)
        if end < 0:
            raise bad(where, key, f"unclosed quote in {shown(text)}")
        return text[1:end], text[end + 1:]
    end = _primitive_end(text)
    return _primitive(text[:end].strip()), text[end:]


def _primitive_end(text: str) -> int:
    depth, i = 0, 0
    while i < len(text):
        if text.startswith("${", i):
            depth, i = depth + 1, i + 2
            continue
        c = text[i]
        if c == "}" and depth:
            depth -= 1
        elif depth == 0 and c in ",]}:":
            return i
        i += 1
    return i


def _sequence(text: str, close: str, where: str, key: str):
    items: list = []
    mapping: dict = {}
    rest = text[1:].lstrip()
    while rest and not rest.startswith(close):
        if close == "}":
            name, rest = _element(rest, where, key)
            if not rest.lstrip().startswith(":"):
                raise bad(where, key, f"a mapping entry needs `name: value`, in {shown(text)}")
            value, rest = _element(rest.lstrip()[1:].lstrip(), where, key)
            mapping[str(name)] = value
        else:
            value, rest = _element(rest, where, key)
            items.append(value)
        rest = rest.lstrip()
        if rest.startswith(","):
            rest = rest[1:].lstrip()
        elif not rest.startswith(close):
            raise bad(where, key, f"cannot read the value {shown(text)} (Hydra's override grammar)")
    if not rest:
        raise bad(where, key, f"no closing {close!r} in {shown(text)}")
    return (mapping if close == "}" else items), rest[1:]


def _primitive(text: str):
    if "${" in text:
        return text  # resolved when read
    lower = text.lower()
    if lower == "null":
        return None
    if lower in ("true", "false"):
        return lower == "true"
    if _INT.fullmatch(text):
        return int(text.replace("_", ""))
    if _FLOAT.fullmatch(text) and any(c.isdigit() for c in text) or lower.lstrip("+-") in ("inf", "nan"):
        return float(text.replace("_", ""))
    return text


# --- the composed config -----------------------------------------------------------------------------------

class Config:
    """verl's composed config, flat (dotted keys -> raw values), with the launch's overrides applied."""

    def __init__(self, keys: dict, mappings, where: str, version: str):
        self.keys = dict(keys)
        self.mappings = set(mappings)
        self.where, self.version = where, version
        self.stated: dict[str, Override] = {}  # key -> the override that set it last

    def has(self, key: str) -> bool:
        return key in self.keys or key in self.mappings

    def nearest(self, key: str) -> str:
        """The valid key closest to a mistyped one: the same last name under the closest section, else the closest
        whole key."""
        tail = key.rsplit(".", 1)[-1]
        same_tail = [k for k in self.keys if k.rsplit(".", 1)[-1] == tail]
        pool = same_tail or list(self.keys)
        best = difflib.get_close_matches(key, pool, n=1, cutoff=0.0 if same_tail else 0.6)
        return best[0] if best else ""

    def apply(self, o: Override) -> None:
        if o.op == "delete":
            if not self.has(o.key):
                raise self._unknown(o, "cannot delete it")
            self._drop(o.key)
        elif o.op == "add" and self.has(o.key):
            raise bad(self.where, o.word, f"verl {self.version}'s config already has {o.key} (Hydra refuses to "
                      f"append it): drop the `+`")
        elif o.op == "set" and not self.has(o.key):
            raise self._unknown(o, "Hydra refuses to override it")
        else:
            self._put(o.key, o.value)
        self.stated[o.key] = o

    def _unknown(self, o: Override, what: str):
        near = self.nearest(o.key)
        hint = f"; did you mean {near}?" if near else ""
        return bad(self.where, o.word, f"unknown key: verl {self.version}'s ppo_trainer config has no "
                   f"{o.key} ({what}){hint} (a new key needs +{o.key}=...)")

    def _drop(self, key: str) -> None:
        for k in [k for k in self.keys if k == key or k.startswith(key + ".")]:
            del self.keys[k]
        self.mappings = {m for m in self.mappings if m != key and not m.startswith(key + ".")}

    def _put(self, key: str, value) -> None:
        if isinstance(value, dict):
            self._drop(key)
            self.mappings.add(key)
            for name, item in value.items():
                self._put(f"{key}.{name}", item)
            return
        self.keys[key] = value
        parts = key.split(".")
        self.mappings.update(".".join(parts[:i]) for i in range(1, len(parts)))

    # --- reading, interpolations resolved ---

    def get(self, key: str, _seen: tuple = ()):
        if key not in self.keys:
            return {k[len(key) + 1:]: self.get(k) for k in self.keys if k.startswith(key + ".")} \
                if key in self.mappings else None
        value = self.keys[key]
        return self._resolve(value, key, _seen + (key,))

    def _resolve(self, value, key: str, seen: tuple):
        if isinstance(value, list):
            return [self._resolve(v, key, seen) for v in value]
        if not isinstance(value, str) or "${" not in value:
            return value
        first = value.find("${")
        if first == 0 and _closing(value, 0) == len(value) - 1:  # the whole value: its type is the target's
            return self._interpolate(value[2:-1], key, seen)
        parts, i = [], 0
        while i < len(value):
            start = value.find("${", i)
            if start < 0:
                parts.append(value[i:])
                break
            end = _closing(value, start)
            resolved = self._interpolate(value[start + 2:end], key, seen)
            parts += [value[i:start], "None" if resolved is None else str(resolved)]
            i = end + 1
        return "".join(parts)

    def _interpolate(self, inner: str, key: str, seen: tuple):
        if inner.startswith("oc.select:"):
            path, comma, default = _split_default(inner[len("oc.select:"):])
            target = _absolute(path.strip(), key)
            if self.has(target):
                return self._lookup(target, key, seen)
            return self._resolve(parse_value(default, self.where, key), key, seen) if comma else None
        target = _absolute(inner.strip(), key)
        if not self.has(target):
            raise bad(self.where, key, f"interpolation ${{{inner}}} names no key of the config")
        return self._lookup(target, key, seen)

    def _lookup(self, target: str, key: str, seen: tuple):
        if target in seen:
            raise bad(self.where, key, f"interpolation loop through {target}")
        return self.get(target, seen)


def _closing(text: str, start: int) -> int:
    depth, i = 0, start
    while i < len(text):
        if text.startswith("${", i):
            depth, i = depth + 1, i + 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return len(text) - 1


def _split_default(text: str) -> tuple[str, bool, str]:
    depth = 0
    for i, c in enumerate(text):
        if text.startswith("${", i):
            depth += 1
        elif c == "}" and depth:
            depth -= 1
        elif c in "[{" and depth == 0:
            depth += 1
        elif c in "]}" and depth:
            depth -= 1
        elif c == "," and depth == 0:
            return text[:i], True, text[i + 1:]
    return text, False, ""


def _absolute(path: str, key: str) -> str:
    """`.x` beside `key`, `..x` one level above, `a.b` as it is."""
    if not path.startswith("."):
        return path
    dots = len(path) - len(path.lstrip("."))
    base = key.split(".")[:-dots]
    return ".".join(base + [path[dots:]]) if path[dots:] else ".".join(base)
