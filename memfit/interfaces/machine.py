"""A machine profile: the runtime constants `memfit calibrate` measured from the user's own monitored runs
(CUDA context, NCCL buffers, allocator slack, host baseline), which `estimate` and `plan` then use in place of
the defaults (data/runtime.toml) and name under "assumed".

Where it is read from: `--machine FILE`, else $MEMFIT_MACHINE, else $XDG_CONFIG_HOME/memfit/machine.toml
(~/.config/memfit/machine.toml) when that file exists. A profile named by flag or variable must exist."""
from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

from memfit.errors import MemfitError
from memfit.facts.runtime import Runtime, default_runtime
from memfit.interfaces.files import FileWrite, write_files

ENV = "MEMFIT_MACHINE"
SCHEMA = "memfit.machine/1"


def default_path() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "memfit" / "machine.toml"


def profile_path(given: str | None) -> Path | None:
    """The profile in use: named (must exist) or the default file when it exists; None = the defaults."""
    named = given or os.environ.get(ENV)
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            origin = "--machine" if given else f"${ENV}"
            raise MemfitError(f"{origin} {named}: no such file (write one with `memfit calibrate RUN.jsonl ... --save`)")
        return path
    path = default_path()
    return path if path.is_file() else None


def load_runtime(given: str | None = None) -> Runtime:
    path = profile_path(given)
    if path is None:
        return default_runtime()
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise MemfitError(f"machine profile {path}: not valid TOML ({e})") from None
    if doc.get("schema") != SCHEMA or not isinstance(doc.get("runtime"), dict):
        raise MemfitError(f"machine profile {path}: expected schema = {SCHEMA!r} and a [runtime] table "
                          "(as `memfit calibrate --save` writes)")
    measured = doc.get("calibrated", {}).get("from", "")
    source = f"machine profile {path}" + (f" (calibrated from {measured})" if measured else "")
    return default_runtime().with_values(doc["runtime"], source)


def render_profile(values: dict, calibrated: dict, comments: dict) -> str:
    """The profile as TOML: each measured constant with the evidence behind it as a comment."""
    lines = [f'schema = "{SCHEMA}"', "", "[calibrated]"]
    lines += [f"{k} = {_toml(v)}" for k, v in calibrated.items()]
    lines += ["", "[runtime]"]
    for name, value in values.items():
        if name in comments:
            lines.append(f"# {comments[name]}")
        lines.append(f"{name} = {_toml(value)}")
    return "\n".join(lines) + "\n"


def save_profile(path: Path, text: str) -> None:
    """Atomic, with a backup of a profile that was there (memfit/interfaces/files.py)."""
    write_files([FileWrite(path, text)], backup=True)


def _toml(value) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string (its escapes are TOML's)
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)
