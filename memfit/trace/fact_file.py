"""The command line every derived fact table shares: write it, or `--check` it against the installed libraries."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable


def write_or_check(description: str, out: Path, render: Callable[[], str], libraries: str,
                   argv: list[str] | None = None) -> int:
    """Write `render()` to `out`, or with --check exit 1 when the shipped table differs from it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="compare with the shipped table instead of writing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = out.read_text() == text
        print(f"{out.name} matches the installed {libraries}" if same else
              f"{out.name} differs from the installed {libraries}: re-derive it")
        return 0 if same else 1
    out.write_text(text)
    print(f"wrote {out}")
    return 0
