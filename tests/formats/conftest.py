"""Example files shaped like the ones each framework ships, and a scratch copy to edit."""
import shutil
from pathlib import Path

import pytest

from format_cases import EXAMPLES


@pytest.fixture
def examples(tmp_path) -> Path:
    """A copy of tests/formats/examples to read, rewrite and re-read on disk."""
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    return tmp_path / "examples"
