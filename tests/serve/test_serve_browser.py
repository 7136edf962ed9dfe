"""`memfit serve` in a real browser: Playwright drives Debian's chromium (never a downloaded one) against the app
on 127.0.0.1 and a free port: the 4 x RTX 4090 Qwen2-7B report goes OOM with a bar over the capacity line, fits
with the optimizer offloaded, exports a DeepSpeed JSON that parses; a LLaMA-Factory YAML fills the form; a bad
value shows its error beside its field. At 1280 x 900 and at 390 x 844: the verdict bar stays in view, an OOM
offers at least two changes that each give "fits" at one click, nothing scrolls sideways, every control has a
label and a 44 px target, a cleared model greys the old verdict out, the plan says how many GPUs it needs and its
row applies. Screenshots go to $MEMFIT_TEST_ARTIFACTS (else a temporary folder); docs/serve-*.png are from it."""
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


def in_view(page) -> None:
    """The verdict bar is on screen (after any change, wherever the page is scrolled)."""
    box = page.locator("#verdict-bar").bounding_box()
    height = page.viewport_size["height"]
    assert box and box["y"] >= -1 and box["y"] + box["height"] <= height, box


def test_the_page_in_chromium(server, tmp_path_factory):
    sync_playwright = sync_playwright_or_skip()
    shots = artifacts(tmp_path_factory)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        try:
            context = browser.new_context(accept_downloads=True, viewport={"width": 1280, "height": 900})
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
    expect(page.locator("#verdict-word")).to_have_text("OOM:")
    expect(page.locator("#headline")).to_contain_text("GiB per GPU of 23.99 GiB")
    in_view(page)
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
    expect(page.locator("#plan-heading")).to_contain_text("that fit on 4 x")
    page.screenshot(path=str(shots / "serve-qwen-plan.png"), full_page=True)


def _offload_and_export(page, shots: Path) -> None:
    from playwright.sync_api import expect

    page.locator('#knobs select[name="offload_optimizer"]').select_option("cpu")
    expect(page.locator("#verdict-word")).to_have_text("FITS:")
    in_view(page)
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
    expect(page.locator("#headline")).to_contain_text("GiB per GPU")
    page.screenshot(path=str(shots / "serve-llamafactory-upload.png"), full_page=True)


def _bad_value(page, shots: Path) -> None:
    from playwright.sync_api import expect

    _type(page, "micro_batch", "0")
    beside = page.locator('.err[data-for="micro_batch"]')
    expect(beside).to_contain_text("--micro-batch must be a positive integer")
    expect(page.locator('#knobs [name="micro_batch"]')).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#answer")).to_have_class("stale")
    expect(page.locator("#live")).to_contain_text("--micro-batch must be a positive integer")
    page.screenshot(path=str(shots / "serve-bad-value.png"), full_page=True)
    _type(page, "micro_batch", "1")
    expect(beside).to_have_text("")


ZERO2_OOM = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "a100-80gb", "tuning": "full",
             "gpus_per_node": "2", "zero_stage": "2"}
PHONE = {"width": 390, "height": 844}


def _fill(page, form: dict) -> None:
    """A fresh page with the form filled as a person leaves it, then one change event (one estimate, not one per
    field: the first test types field by field)."""
    page.goto(page.url.split("#")[0])
    page.evaluate("""form => { for (const [k, v] of Object.entries(form)) document.getElementById("knobs")
        .elements[k].value = v; }""", form)
    page.locator('#knobs [name="model"]').dispatch_event("change")


@pytest.mark.parametrize("viewport", [{"width": 1280, "height": 900}, PHONE], ids=["desktop", "phone"])
def test_an_oom_offers_fixes_that_fit_at_one_click(server, tmp_path_factory, viewport):
    from playwright.sync_api import expect

    sync_playwright = sync_playwright_or_skip()
    shots = artifacts(tmp_path_factory)
    name = "phone" if viewport == PHONE else "desktop"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        try:
            page = browser.new_context(viewport=viewport).new_page()
            page.goto(server + "/")
            expect(page.locator("#bar")).to_have_class("stale")
            _fill(page, ZERO2_OOM)
            expect(page.locator("#verdict-word")).to_have_text("OOM:")
            fixes = page.locator("#fixes button.fix")
            expect(fixes.first).to_be_visible()
            count = fixes.count()
            assert count >= 2
            _laid_out(page, name)
            expect(page.locator("#live")).to_contain_text("OOM: ")
            page.screenshot(path=str(shots / f"serve-{name}.png"), full_page=False)
            for i in range(count):
                _fill(page, ZERO2_OOM)
                expect(page.locator("#fixes button.fix")).to_have_count(count)
                label = page.locator("#fixes button.fix").nth(i).inner_text()
                page.locator("#fixes button.fix").nth(i).click()
                try:
                    expect(page.locator("#verdict-word")).to_have_text("FITS:", timeout=30_000)
                except AssertionError:
                    raise AssertionError((label, page.locator("#headline").inner_text(),
                                          page.locator("#general-error").inner_text(),
                                          page.evaluate("JSON.stringify(request())"))) from None
                assert "slower" in label or "faster" in label or "as fast" in label, label
                in_view(page)
            _cleared_model_greys_out(page)
        finally:
            browser.close()


def _laid_out(page, name: str) -> None:
    """No horizontal scroll, the verdict in view even scrolled to the bottom, labels on every control, targets of
    44 px or more."""
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "the page scrolls sideways"
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    in_view(page)
    page.evaluate("window.scrollTo(0, 0)")
    unlabelled = page.evaluate("""[...document.querySelectorAll('input, select')]
        .filter(e => !e.labels || e.labels.length === 0).map(e => e.id || e.name)""")
    assert unlabelled == []
    small = page.evaluate("""[...document.querySelectorAll('button, select, input:not([type=checkbox]):not([type=file])')]
        .filter(e => e.offsetParent !== null && e.getBoundingClientRect().height < 44).map(e => e.id || e.name)""")
    assert small == [], f"{name}: targets under 44 px: {small}"


def _cleared_model_greys_out(page) -> None:
    from playwright.sync_api import expect

    page.locator('#knobs [name="model"]').fill("")
    expect(page.locator("#bar")).to_have_class("stale")
    expect(page.locator("#answer")).to_have_class("stale")
    expect(page.locator("#live")).to_contain_text("name a model")


def test_the_plan_fits_a_phone_and_its_rows_apply(server, tmp_path_factory):
    from playwright.sync_api import expect

    sync_playwright = sync_playwright_or_skip()
    shots = artifacts(tmp_path_factory)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        try:
            page = browser.new_context(viewport=PHONE).new_page()
            page.goto(server + "/")
            _fill(page, {"model": "llama3.1-8b", "gpu": "rtx4090", "tuning": "full", "host_ram": "128GiB"})
            expect(page.locator("#verdict-word")).to_have_text("OOM:")
            page.locator("#plan-button").click()
            expect(page.locator("#plan-heading")).to_contain_text("needs 2 GPUs of this kind", timeout=60_000)
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
            table = page.locator("#plan-table").bounding_box()
            assert table["x"] >= 0 and table["x"] + table["width"] <= PHONE["width"], table
            page.screenshot(path=str(shots / "serve-phone-plan.png"), full_page=True)
            page.locator("button.apply-row").first.click()
            expect(page.locator("#verdict-word")).to_have_text("FITS:", timeout=30_000)
            expect(page.locator('#knobs [name="gpus_per_node"]')).to_have_value("2")
            in_view(page)
        finally:
            browser.close()


def test_defaults_show_their_values_and_long_runs_warn(server):
    from playwright.sync_api import expect

    sync_playwright = sync_playwright_or_skip()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.goto(server + "/")
            _fill(page, {"model": "meta-llama/Llama-3.1-8B-Instruct", "seq_len": "10000000"})
            expect(page.locator("#warnings")).to_contain_text("max_position_embeddings")
            expect(page.locator('#knobs [name="precision"] option').first).to_have_text("(profile default: bf16-pure)")
            expect(page.locator("#summary")).to_contain_text("meta-llama/Llama-3.1-8B-Instruct on 1 x")
            expect(page.locator("#lists")).to_contain_text("checkpointing=off (hf-trainer default)")
            ticks = page.locator("svg#per-rank text.tick").count()
            assert 0 < ticks <= 12
        finally:
            browser.close()
