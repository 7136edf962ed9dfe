"""Where the team's measured cases live: `cases/` in this repository (a copy of the team's case folder, refreshed
by `python tools/sync_cases.py FOLDER`), or $MEMFIT_SHARED_CASES for another copy. The benches and the tests that
check against the cases read it."""
import os
from pathlib import Path

CASES = Path(os.environ.get("MEMFIT_SHARED_CASES") or Path(__file__).resolve().parents[1] / "cases")
PUBLISHED = CASES / "published.jsonl"
USER_REPORTS = CASES / "user-reports.jsonl"
THROUGHPUT = CASES / "throughput.jsonl"
