"""The team's case files beside the checkout (../shared/cases, found by bench/shared_cases.py): a test that reads
one skips, saying which file and why, where they are absent (a checkout on its own), instead of failing."""
from pathlib import Path

import pytest


def shared(path: Path) -> Path:
    """PATH if the file is there, else skip the test (or the module, at its top) naming it."""
    __tracebackhide__ = True
    if not path.is_file():
        pytest.skip(f"{path} is absent: the team's case files are not beside this checkout (../shared/cases, "
                    "or set $MEMFIT_SHARED_CASES)", allow_module_level=True)
    return path
