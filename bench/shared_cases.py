"""Where the team's measured cases live: `shared/cases` beside this checkout (our layout), or $MEMFIT_SHARED_CASES
for a checkout elsewhere (a temporary clone). The benches and the tests that check against the cases read it."""
import os
from pathlib import Path

CASES = Path(os.environ.get("MEMFIT_SHARED_CASES") or Path(__file__).resolve().parents[2] / "shared" / "cases")
PUBLISHED = CASES / "published.jsonl"
USER_REPORTS = CASES / "user-reports.jsonl"
