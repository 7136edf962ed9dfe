"""The real browser for the HTML and web-app tests: Debian's chromium driven by Playwright (which must never
download a browser of its own). A test skips, saying what to install, only where either is missing."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"


def sync_playwright_or_skip():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright==1.55.0; no `playwright install`)")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"Debian's chromium is not installed ({CHROMIUM}: apt-get install -y chromium)")
    return sync_playwright


def artifacts(tmp_path_factory) -> Path:
    """Where screenshots go: $MEMFIT_TEST_ARTIFACTS, else a temporary folder."""
    folder = Path(os.environ.get("MEMFIT_TEST_ARTIFACTS") or tmp_path_factory.mktemp("artifacts"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder
