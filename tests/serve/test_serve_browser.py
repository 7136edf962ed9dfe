"""`memfit serve` in a real browser: Playwright drives Debian's chromium (never a downloaded one) against the app
on 127.0.0.1 and a free port: the 4 x RTX 4090 Qwen2-7B report goes OOM with a bar over the capacity line, fits
with the optimizer offloaded, exports a DeepSpeed JSON that parses; a LLaMA-Factory YAML fills the form; a bad
value shows its error beside its field. Screenshots go to $MEMFIT_TEST_ARTIFACTS (else a temporary folder)."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="memfit[serve] is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="memfit[serve] is not installed")

from browser_support import CHROMIUM, artifacts, sync_playwright_or_skip  # noqa: E402
from net_support import free_port  # noqa: E402
from memfit.interfaces.serve.app import create_app  # noqa: E402

LLAMA_YAML = (Path(__file__).resolve().parent.parent / "formats" / "examples" / "llamafactory" / "examples"
              / "train_lora" / "llama3_lora_sft.yaml")
QWEN_FORM = {"gpu": "rtx4090", "profile": "openrlhf", "tuning": "full", "zero_stage": "3", "precision": "bf16-mixed",
             "checkpointing": "full", "attention": "flash"}
QWEN_TYPED = {"gpus_per_node": "4", "seq_len": "128", "micro_batch": "4"}


@pytest.fixture(scope="module")
def server():
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


def _bars_against_capacity(page) -> tuple[float, float]:
    """The top of the device-total stack and the capacity line's y on screen (y grows downward)."""
    bars = page.locator('svg#per-rank rect.seg[data-bar="device_total"]')
    assert bars.count() > 0
    boxes = [bars.nth(i).bounding_box() for i in range(bars.count())]
    assert all(b and b["height"] > 0 for b in boxes)
    line = page.locator("svg#per-rank line.capacity").bounding_box()
    return min(b["y"] for b in boxes), line["y"]


def _type(page, name: str, value: str) -> None:
    box = page.locator(f'#knobs [name="{name}"]')
    box.fill(value)
    box.press("Tab")  # the change event a person's edit fires


def test_the_page_in_chromium(server, tmp_path_factory):
    sync_playwright = sync_playwright_or_skip()
    shots = artifacts(tmp_path_factory)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        try:
            context = browser.new_context(accept_downloads=True, viewport={"width": 1200, "height": 1000})
            page = context.new_page()
            elsewhere = []
            page.on("request", lambda r: None if r.url.startswith(server) else elsewhere.append(r.url))
            page.goto(server + "/")
            _qwen_report(page, shots)
            _plan(page, shots)
            _offload_and_export(page, shots)
            _upload_llamafactory(page, shots)
            _bad_value(page, shots)
            assert elsewhere == []  # the page fetches nothing but the API
        finally:
            browser.close()


def _qwen_report(page, shots: Path) -> None:
    from playwright.sync_api import expect

    _type(page, "model", "Qwen/Qwen2-7B-Instruct")
    for name, value in QWEN_FORM.items():
        page.locator(f'#knobs select[name="{name}"]').select_option(value)
    for name, value in QWEN_TYPED.items():
        _type(page, name, value)
    expect(page.locator("#verdict .word")).to_have_text("OOM")
    expect(page.locator("#verdict")).to_contain_text("of 23.99 GiB per GPU")
    top, capacity = _bars_against_capacity(page)
    assert top < capacity  # the stack rises over the card's capacity
    page.screenshot(path=str(shots / "serve-qwen-oom.png"), full_page=True)


def _plan(page, shots: Path) -> None:
    """The plan view: asked for once, it lists the configurations that fit (and follows the knobs after)."""
    from playwright.sync_api import expect

    page.locator("#plan-button").click()
    expect(page.locator("#plan-table")).to_be_visible(timeout=60_000)
    rows = page.locator("#plan-table tr")
    assert rows.count() >= 3  # header, start, at least one plan
    assert "fits" in rows.nth(2).inner_text()
    page.screenshot(path=str(shots / "serve-qwen-plan.png"), full_page=True)


def _offload_and_export(page, shots: Path) -> None:
    from playwright.sync_api import expect

    page.locator('#knobs select[name="offload_optimizer"]').select_option("cpu")
    expect(page.locator("#verdict .word")).to_have_text("FITS")
    top, capacity = _bars_against_capacity(page)
    assert top > capacity
    page.screenshot(path=str(shots / "serve-qwen-offload-fits.png"), full_page=True)
    page.locator("#format").select_option("deepspeed")
    with page.expect_download() as info:
        page.locator("#export").click()
    download = info.value
    assert download.suggested_filename == "ds_config.json"
    ds = json.loads(Path(download.path()).read_text())
    assert ds["zero_optimization"]["stage"] == 3 and ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    with page.expect_download() as info:
        page.locator("#report").click()
    report = Path(info.value.path()).read_text()
    assert report.startswith("<!DOCTYPE html>") and 'class="verdict fits"' in report


def _upload_llamafactory(page, shots: Path) -> None:
    from playwright.sync_api import expect

    page.locator("#framework-file").set_input_files(str(LLAMA_YAML))
    expect(page.locator("#imported")).to_contain_text("llama3_lora_sft.yaml (llamafactory)")
    expect(page.locator("#imported")).to_contain_text("lora_rank=8")
    form = page.locator("#knobs")
    expect(form.locator('[name="model"]')).to_have_value("meta-llama/Meta-Llama-3-8B-Instruct")
    expect(form.locator('[name="tuning"]')).to_have_value("lora")
    expect(form.locator('[name="seq_len"]')).to_have_value("2048")
    expect(form.locator('[name="micro_batch"]')).to_have_value("1")
    expect(form.locator('[name="profile"]')).to_have_value("llamafactory")
    expect(page.locator("#verdict")).to_contain_text("GiB per GPU")
    page.screenshot(path=str(shots / "serve-llamafactory-upload.png"), full_page=True)


def _bad_value(page, shots: Path) -> None:
    from playwright.sync_api import expect

    _type(page, "micro_batch", "0")
    beside = page.locator('.err[data-for="micro_batch"]')
    expect(beside).to_contain_text("--micro-batch must be a positive integer")
    expect(page.locator('#knobs [name="micro_batch"]')).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#result")).to_have_class("stale")
    page.screenshot(path=str(shots / "serve-bad-value.png"), full_page=True)
    _type(page, "micro_batch", "1")
    expect(beside).to_have_text("")
