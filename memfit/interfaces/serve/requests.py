"""`memfit serve`'s request documents -> memfit's own inputs: the Scenario the command line would build from the
same flags, and the framework file an upload holds. No web framework here (tests call it directly).

A request names things by the knob table's names (or a flag's spelling without dashes: `gpus`, `zero`); values
are JSON (numbers may come as strings, as a form sends them). Each value goes through the command line's own
converters and knobs_from_args, so the API accepts and refuses exactly what the flags do.

Nothing from a request reaches the file system: a model is a catalog name, a hub id or a config.json sent as an
object (never a path; memfit's find_model would read a local path), and an uploaded file is read as text whose
name is only shown.
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
from functools import cache
from pathlib import PurePosixPath

from memfit.errors import MemfitError
from memfit.facts.knobs import Knob, hardware, inputs, knobs

# the request keys that are not knobs, per endpoint (the planner's options, the export format)
EXTRA_KEYS = {"estimate": (), "plan": ("allow", "global_batch", "top", "no_code_edits", "no_resume"),
              "export": ("format",)}
# inputs a server does not take from a request: both name a file on the server's disk
REFUSED = {"from_file": "upload the framework file to /api/import instead",
           "machine": "the server uses its own machine profile ($MEMFIT_MACHINE or ~/.config/memfit/machine.toml)",
           "framework_version": "the server estimates memfit's pinned framework releases; name other releases with "
                                "the command line's --framework-version"}
NAME_LIMIT = 120  # characters of an uploaded file's name kept for display


class FieldError(MemfitError):
    """A MemfitError that knows which request field it is about (the page shows it beside that field)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@cache
def _table() -> dict[str, Knob]:
    return {**inputs(), **hardware(), **knobs()}


@cache
def spellings() -> dict[str, str]:
    """Every key a request may use -> the knob's name: the name, and each flag spelling with `_` for `-`."""
    out: dict[str, str] = {}
    for name, k in _table().items():
        for flag in (k.flag, *k.aliases):
            out.setdefault(flag.lstrip("-").replace("-", "_"), name)
        out[name] = name
    return out


@cache
def _flag_pattern() -> re.Pattern:
    """A knob's flag inside an error message (longest first: --seq-len before --seq)."""
    flags = sorted({f for k in _table().values() for f in (k.flag, *k.aliases)}, key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, flags)) + r")(?![\w-])")


def field_of(message: str) -> str | None:
    """The knob an error message of memfit's is about: the first flag it names (memfit's messages name the flag
    the user typed, e.g. `--micro-batch must be a positive integer`)."""
    m = _flag_pattern().search(message)
    if not m:
        return None
    flag = m.group(1)
    return next(name for name, k in _table().items() if flag in (k.flag, *k.aliases))


def canonical(body, extra: tuple[str, ...] = ()) -> dict:
    """The request's keys as knob names; an unknown key, two spellings of one knob or a refused input is an error."""
    if not isinstance(body, dict):
        raise FieldError(f"the request body must be a JSON object, got a {type(body).__name__}")
    out: dict = {}
    names = spellings()
    for key, value in body.items():
        if key in extra or key in ("model_name", "unread"):
            out[key] = value
            continue
        name = names.get(key)
        if name is None:
            close = difflib.get_close_matches(key, list(names) + list(extra), n=1, cutoff=0.75)
            hint = f"; did you mean {close[0]!r}?" if close else "; the knobs are listed by `memfit estimate --help`"
            raise FieldError(f"unknown field {_shown(key)}{hint}", key[:60])
        if name in REFUSED:
            raise FieldError(f"{name} is not accepted by the server: {REFUSED[name]}", name)
        if name in out:
            raise FieldError(f"{_shown(key)} and another spelling both set {name}; say it once", name)
        out[name] = value
    return out


def _typed(k: Knob, value):
    """A JSON value as the command line's converter for this knob would give it (a string, as typed, is
    converted by the same function argparse calls)."""
    from memfit.interfaces.cli.args import whole_number

    label = k.label
    if value is None or value == "":
        return None
    if k.type == "bool":
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise FieldError(f"{label} expects true or false, got {_shown(value)}", k.name)
        return value
    if isinstance(value, bool) and not (k.const is not None and value):
        raise FieldError(f"{label} expects a {k.type}, got {_shown(value)}", k.name)
    if k.const is not None and value is True:  # the bare flag: `"checkpointing": true` is --checkpointing
        return k.const
    if k.type == "int":
        if not isinstance(value, (int, float, str)):
            raise FieldError(f"{label} expects a whole number, got {_shown(value)}", k.name)
        try:
            return whole_number(str(value).strip())
        except (argparse.ArgumentTypeError, ValueError, OverflowError):
            raise FieldError(f"{label} expects a whole number, got {_shown(value)}", k.name) from None
    if k.type == "float":
        try:
            number = float(value) if isinstance(value, (int, float, str)) else None
        except (ValueError, OverflowError):
            number = None
        if number is None:
            raise FieldError(f"{label} expects a number, got {_shown(value)}", k.name)
        return number
    if k.type == "list" and isinstance(value, list) and all(isinstance(x, str) for x in value):
        return ",".join(value)  # knobs_from_args splits it as it splits --lora-targets q,v
    if k.type == "pairs" and isinstance(value, dict):
        return ",".join(f"{a}={n}" for a, n in value.items())
    if not isinstance(value, str):
        raise FieldError(f"{label} expects a string, got {_shown(value)}", k.name)
    return value


def _shown(value) -> str:
    """A request's value in an error: the readers' bounded repr (formats.base.shown), so no message built from a
    request ever holds more than a few dozen of its characters."""
    from memfit.interfaces.formats.base import shown

    return shown(value)


def _namespace(b: dict) -> argparse.Namespace:
    """What argparse would hold for these values (every scenario argument; unset ones None)."""
    table = _table()
    values = {name: None for name in table}
    for name in table:
        if name in b and name not in ("model", "profile"):
            values[name] = _typed(table[name], b[name])
    values["profile"] = _typed(table["profile"], b.get("profile"))
    return argparse.Namespace(**values)


def scenario(body, extra: tuple[str, ...] = ()):
    """The Scenario `memfit estimate` builds from the same knobs (flags given = the request's keys)."""
    from memfit.facts.profiles import build_scenario
    from memfit.interfaces.cli.args import hardware_from_args, knobs_from_args

    b = canonical(body, extra)
    ns = _namespace(b)
    model = model_of(b.get("model"), b.get("model_name"))
    if ns.gpu:  # the catalog's message names --gpu-mem as the way out; the field to fix is the GPU
        from memfit.facts.catalog import find_gpu

        try:
            find_gpu(ns.gpu)
        except MemfitError as e:
            raise FieldError(str(e), "gpu") from None
    hw = hardware_from_args(ns)
    given = knobs_from_args(ns)
    typed = {k for k, v in given.items() if v is not None}
    s = build_scenario(model, hw, given, ns.profile or "hf-trainer", typed=typed)
    return s.with_changes(unread=_unread(b.get("unread"))) if b.get("unread") else s


MAX_UNREAD = 32  # settings of one imported file memfit could not read; each a line of at most 300 characters


def _unread(value) -> tuple[str, ...]:
    """An imported file's settings memfit could not read (/api/import's "unread"), sent back with each estimate:
    they cap its verdict at "tight" as on the command line."""
    if not isinstance(value, list) or len(value) > MAX_UNREAD or not all(
            isinstance(v, str) and 0 < len(v) <= 300 for v in value):
        raise FieldError(f"unread: a list of up to {MAX_UNREAD} lines of text (as /api/import returns)", "unread")
    return tuple(value)


# ---------------------------------------------------------------- the model


def _norm(name: str) -> str:  # as the catalog normalises names (facts/catalog.py)
    return name.strip().lower().replace("_", "-").replace(" ", "-")


@cache
def _catalog() -> dict:
    from memfit.facts.catalog import models

    index: dict = {}
    for m in models():
        for key in (m.id, m.id.split("/")[-1], *m.aliases):
            index.setdefault(_norm(key), m)
    return index


def _pathlike(name: str) -> bool:
    return (name.startswith((".", "/", "~", "\\")) or ".." in name or "\\" in name or "\x00" in name
            or name.lower().endswith(".json") or ":" in name)


def model_of(value, display=None):
    """A catalog model, a hub model (by id) or a config.json sent as an object; never a path on the server."""
    from memfit.facts import catalog, hub

    if isinstance(value, dict):
        return model_from_object(value, display)
    if not isinstance(value, str) or not value.strip():
        raise FieldError("say which model: a hub id or alias (see `memfit models`), or upload its config.json",
                         "model")
    name = value.strip()
    if len(name) > 200 or _pathlike(name):
        raise FieldError(f"model {_shown(name)}: the server reads no paths; give a hub id or alias, or upload the "
                         "config.json", "model")
    index = _catalog()
    found = index.get(_norm(name)) or index.get(_norm(name.split("/")[-1]))
    if found:
        return catalog.as_named(found, name)  # the id the user chose, not the base row's
    if hub.looks_like_hub_id(name):
        try:  # the catalog's own hub reader (catalog.find_model would first try the name as a local path)
            return catalog._hub_model(name)
        except MemfitError as e:
            raise FieldError(f"unknown model {_shown(name)}: not in the catalog; {e}", "model") from None
    close = difflib.get_close_matches(_norm(name), list(index), n=3, cutoff=0.5)
    hint = f"; did you mean: {', '.join(close)}?" if close else " (see `memfit models`, or upload a config.json)"
    raise FieldError(f"unknown model {_shown(name)}{hint}", "model")


class _Uploaded:
    """A config.json that is not on disk: it answers the few Path calls memfit's config reader makes
    (catalog.model_from_config_file: is_dir, is_file, read_text, str) from the request's text."""

    def __init__(self, text: str, name: str):
        self.text, self.name = text, name

    def is_dir(self) -> bool:
        return False

    def is_file(self) -> bool:
        return True

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.text

    def __str__(self) -> str:
        return self.name

    __fspath__ = None  # not a path: open() refuses it


def model_from_object(config: dict, display=None):
    from memfit.facts.catalog import model_from_config_file

    name = display_name(display) if isinstance(display, str) and display.strip() else "config.json (uploaded)"
    try:
        # an upload stands in for the Path: the reader calls only the Path methods _Uploaded answers
        return model_from_config_file(_Uploaded(json.dumps(config), name))  # type: ignore[arg-type]
    except FieldError:
        raise
    except MemfitError as e:
        raise FieldError(str(e), "model") from None


def display_name(name: str) -> str:
    """An uploaded file's name as shown: its last part only (../../etc/passwd -> passwd), printable, short."""
    last = PurePosixPath(name.replace("\\", "/")).name or "upload"
    shown = "".join(c for c in last if c.isprintable())
    return shown[:NAME_LIMIT] or "upload"
