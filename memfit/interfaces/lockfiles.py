"""`--framework-version`: the framework releases a run uses, as NAME=VERSION pairs or read from the training
machine's lock file (a pip freeze / requirements.txt, uv.lock, poetry.lock).

Not read from this machine's environment: memfit often plans on another machine than the one that trains.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

from memfit.errors import MemfitError

WANTED = ("trl", "transformers", "deepspeed", "peft", "accelerate")  # the releases memfit's facts depend on
_PAIR = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*(?:==|=)\s*([^\s;,]+)\s*$")
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(==|===|>=|<=|~=|!=|>|<)?\s*([^\s;,\\]*)")


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text.strip().lower())


def framework_versions(items: list[str] | None) -> dict[str, str]:
    """Each --framework-version value: NAME=VERSION, or the path of a lock file (only its WANTED packages)."""
    out: dict[str, str] = {}
    for item in items or ():
        found = _lock_file(Path(item)) if Path(item).is_file() else _pair(item)
        for name, version in found.items():
            if out.get(name, version) != version:
                raise MemfitError(f"--framework-version says {name} {out[name]} and {name} {version}; say one")
            out[name] = version
    return out


def _pair(text: str) -> dict[str, str]:
    m = _PAIR.match(text)
    if not m:
        raise MemfitError(f"--framework-version {text!r}: write NAME=VERSION (e.g. trl=0.8.6, transformers=4.44) or "
                          "the path of a lock file (requirements.txt / pip freeze, uv.lock, poetry.lock)")
    return {_name(m.group(1)): m.group(2)}


def _lock_file(path: Path) -> dict[str, str]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise MemfitError(f"--framework-version {path}: cannot read it ({e.__class__.__name__})") from None
    found = _toml_lock(path, text) if path.suffix == ".lock" else _requirements(path, text)
    if not found:
        raise MemfitError(f"--framework-version {path}: pins none of {', '.join(WANTED)}")
    return found


def _toml_lock(path: Path, text: str) -> dict[str, str]:
    """uv.lock and poetry.lock: [[package]] tables with name and version."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise MemfitError(f"--framework-version {path}: not a uv / poetry lock file ({e})") from None
    out: dict[str, str] = {}
    for package in doc.get("package", []):
        name = _name(str(package.get("name", "")))
        if name in WANTED and "version" in package:
            if out.get(name, package["version"]) != package["version"]:
                raise MemfitError(f"--framework-version {path}: locks {name} {out[name]} and {package['version']} "
                                  "(one per platform?); say --framework-version NAME=VERSION")
            out[name] = str(package["version"])
    return out


def _requirements(path: Path, text: str) -> dict[str, str]:
    """pip freeze / requirements.txt: `name==version` lines; a WANTED package not pinned exactly is an error
    (a range is not the release that runs)."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")) or " @ " in line:
            continue
        m = _REQUIREMENT.match(line)
        if not m or _name(m.group(1)) not in WANTED:
            continue
        name, op, version = _name(m.group(1)), m.group(2), m.group(3)
        if op not in ("==", "==="):
            raise MemfitError(f"--framework-version {path}:{number}: {line!r} does not pin one release; memfit needs "
                              "the release that runs (a pip freeze, uv.lock or poetry.lock)")
        out[name] = version
    return out
