"""The team's case files (cases/ in the repository, or the copy $MEMFIT_SHARED_CASES names; bench/shared_cases.py):
a test that reads one skips, saying which file and why, where $MEMFIT_SHARED_CASES names a folder without it,
instead of failing."""
from pathlib import Path

import pytest


def shared(path: Path) -> Path:
    """PATH if the file is there, else skip the test (or the module, at its top) naming it."""
    __tracebackhide__ = True
    if not path.is_file():
        pytest.skip(f"{path} is absent: $MEMFIT_SHARED_CASES names a folder without the team's case files "
                    "(cases/ in the repository has them)", allow_module_level=True)
    return path
