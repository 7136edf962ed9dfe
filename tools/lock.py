"""Write constraints.txt: every package the README's install resolves to, pinned to the release installed here.

    python tools/lock.py [--check]

.ci/run and the README install with `-c constraints.txt`, so CI and a newcomer get the environment the
tests and benches ran in. Run this after changing an extra (pip resolves the names; this environment, where
the suite passed, gives the versions). --check exits 1 when constraints.txt differs from what it would write.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = "test,trace,measure,validate,hub,peers,serve,monitor,data"  # the README's test command installs these
HEADER = ("# Written by tools/lock.py from the environment the suite passed in; do not edit by hand.\n"
          "# pip install -c constraints.txt ... (README, .ci/run)\n")


def resolved_names() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--report", str(report), "-e", f"{ROOT}[{EXTRAS}]"], check=True, capture_output=True)
        names = {row["metadata"]["name"] for row in json.loads(report.read_text())["install"]}
        versions = {row["metadata"]["name"]: row["metadata"]["version"]
                    for row in json.loads(report.read_text())["install"]}
    names.discard("memfit")
    return sorted(((n, versions[n]) for n in names), key=lambda nv: nv[0].lower())


def lock_text() -> str:
    lines = []
    for name, resolved in resolved_names():
        try:
            got = version(name)
        except PackageNotFoundError:
            got = resolved  # not installed here (e.g. a platform-only dependency): what pip chose
        lines.append(f"{name}=={got.split('+', 1)[0]}")
    return HEADER + "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    path = ROOT / "constraints.txt"
    text = lock_text()
    if "--check" in argv:
        ok = path.exists() and path.read_text() == text
        print("constraints.txt is current" if ok else "constraints.txt is stale: run python tools/lock.py")
        return 0 if ok else 1
    path.write_text(text)
    print(f"wrote {path} ({text.count(chr(10)) - 2} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
