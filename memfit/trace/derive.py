"""Re-derive every derived fact table against the installed libraries, and say per table which facts moved.

    python -m memfit.trace.derive            # re-derive each table and report what moved; writes nothing
    python -m memfit.trace.derive --write    # ... and write the tables that moved
    python -m memfit.trace.derive --only peft,autocast

After a library upgrade this is the one command: each table's own deriver runs (the modules below, each also
runnable alone with --check), its text is compared with the shipped file key by key, and a moved number is shown
with its relative change. Exit 1 when any table moved (and was not written). The tables derived from benches
(data/error_bands.toml: bench/error_bands.py; data/speed.toml: tools/calibrate_speed.py) and from other venvs
(torchtune: memfit/trace/torchtune_facts.py under .venvs/torchtune) are listed, not re-derived here.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeGuard

DATA = Path(__file__).resolve().parent.parent / "facts" / "data"


@dataclass(frozen=True)
class Deriver:
    name: str
    module: str  # memfit.trace.<module>: its `derived_text()` renders the table from the installed libraries
    table: Path


DERIVERS = (
    Deriver("activations", "activation_facts", DATA / "activations.toml"),
    Deriver("peft", "peft_facts", DATA / "peft.toml"),
    Deriver("autocast", "autocast", DATA / "cuda_autocast.toml"),
    Deriver("allocator_slack", "allocator_facts", DATA / "allocator_slack.toml"),
    Deriver("allocator_reserve", "allocator_reserve", DATA / "allocator_reserve.toml"),
)
ELSEWHERE = ("error_bands.toml: python bench/error_bands.py --check",
             "speed.toml: python tools/calibrate_speed.py",
             "torchtune rows: .venvs/torchtune/bin/python -m memfit.trace.torchtune_facts --check",
             "remote_code.toml: python -m memfit.trace.glm4_facts --check; python -m memfit.trace.qwen1_facts --check")


def flatten(doc, prefix: str = "") -> dict[str, object]:
    """A TOML document as {"table.key": value}; lists stay values (a list that moved is shown whole)."""
    if not isinstance(doc, dict):
        return {prefix: doc}
    out: dict[str, object] = {}
    for key, value in doc.items():
        out |= flatten(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def moved(old_text: str, new_text: str) -> list[str]:
    """Each fact that differs between the shipped and the re-derived table, one line each."""
    old, new = flatten(tomllib.loads(old_text)), flatten(tomllib.loads(new_text))
    lines = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if key not in new:
            lines.append(f"  {key}: {a!r} -> gone")
        elif key not in old:
            lines.append(f"  {key}: new, {b!r}")
        elif _number(a) and _number(b) and a:
            lines.append(f"  {key}: {a!r} -> {b!r} ({(b - a) / abs(a):+.1%})")
        else:
            lines.append(f"  {key}: {a!r} -> {b!r}")
    return lines


def _number(x: object) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def rederive(d: Deriver, render: Callable[[], str] | None = None, write: bool = False) -> tuple[bool, list[str]]:
    """(moved?, report lines) for one table."""
    text = (render or importlib.import_module(f"memfit.trace.{d.module}").derived_text)()
    shipped = d.table.read_text()
    if text == shipped:
        return False, [f"{d.table.name}: unchanged"]
    lines = moved(shipped, text) or ["  (comments or layout only)"]
    if write:
        d.table.write_text(text)
    return True, [f"{d.table.name}: {len(lines)} fact(s) moved" + (", written" if write else ""), *lines]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="write the tables that moved")
    p.add_argument("--only", default="", help=f"comma-separated: {', '.join(d.name for d in DERIVERS)}")
    a = p.parse_args(argv)
    names = {n.strip() for n in a.only.split(",") if n.strip()}
    unknown = names - {d.name for d in DERIVERS}
    if unknown:
        print(f"derive: unknown table {', '.join(sorted(unknown))}; choose from: "
              f"{', '.join(d.name for d in DERIVERS)}", file=sys.stderr)
        return 2
    changed = False
    for d in DERIVERS:
        if names and d.name not in names:
            continue
        did, lines = rederive(d, write=a.write)
        changed |= did
        print("\n".join(lines), flush=True)
    print("not re-derived here: " + "; ".join(ELSEWHERE))
    print("next: " + ("python -m memfit.trace.derive --write, then the tests" if changed and not a.write else
                      "run the tests" if changed else "nothing to do"))
    return 1 if changed and not a.write else 0


if __name__ == "__main__":
    sys.exit(main())
