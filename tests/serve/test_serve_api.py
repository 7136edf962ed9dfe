"""`memfit serve`'s JSON API through FastAPI's TestClient (no network): each endpoint answers with memfit's own
documents, and malformed, oversized and hostile requests get a 4xx with one line naming the field."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="memfit[serve] is not installed")
from fastapi.testclient import TestClient  # noqa: E402

from memfit.interfaces.cli.main import main  # noqa: E402
from memfit.interfaces.serve.app import create_app  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "formats" / "examples"
LLAMA_YAML = EXAMPLES / "llamafactory" / "examples" / "train_lora" / "llama3_lora_sft.yaml"
# the 4 x RTX 4090 Qwen2-7B report: OOM as given, fits with the optimizer on the CPU
QWEN = {"model": "Qwen/Qwen2-7B-Instruct", "gpu": "rtx4090", "gpus": 4, "profile": "openrlhf", "tuning": "full",
        "zero_stage": 3, "precision": "bf16-mixed", "checkpointing": "full", "attention": "flash", "seq_len": 128,
        "micro_batch": 4}
QWEN_FLAGS = ["Qwen/Qwen2-7B-Instruct", "--gpu", "rtx4090", "--gpus", "4", "--profile", "openrlhf", "--tuning", "full",
              "--zero-stage", "3", "--precision", "bf16-mixed", "--checkpointing", "full", "--attention", "flash",
              "--seq-len", "128", "--micro-batch", "4"]
TINY_CONFIG = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
               "num_key_value_heads": 8, "vocab_size": 32000, "intermediate_size": 1376}


JSON = {"content-type": "application/json"}  # what a raw `content=` body needs: the API takes JSON only


def app_client(**options) -> TestClient:
    """A client of the app; TestClient names the server `testserver` in its Host header, so the app is told that
    is its own name (as `memfit serve` tells it the address it binds)."""
    app = create_app(allowed_hosts=("testserver",), **options)
    app.state.pool.warm()
    return TestClient(app)


@pytest.fixture(scope="module")
def client():
    return app_client()


def cli_json(argv) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return json.loads(out.getvalue())


def refused(r, status: int, field=None, needle: str = "") -> dict:
    body = r.json()
    assert r.status_code == status, body
    assert set(body) == {"error", "field"} and body["field"] == field
    assert "\n" not in body["error"] and len(body["error"]) <= 500
    assert needle.lower() in body["error"].lower()
    return body


# ---------------------------------------------------------------- each endpoint


# the command line's next steps are flags for its own command line; the page has none of those
CLI_ONLY = ("next_steps", "plan_command")


def _cli_estimate(argv) -> dict:
    doc = cli_json(argv)
    assert all(k in doc for k in CLI_ONLY)
    return {k: v for k, v in doc.items() if k not in CLI_ONLY}


def test_estimate_is_the_cli_document(client):
    r = client.post("/api/estimate", json=QWEN)
    assert r.status_code == 200
    assert r.json() == _cli_estimate(["estimate", *QWEN_FLAGS, "--json"])
    assert r.json()["verdict"] == "oom"
    offload = client.post("/api/estimate", json=QWEN | {"offload_optimizer": "cpu"}).json()
    assert offload == _cli_estimate(["estimate", *QWEN_FLAGS, "--offload-optimizer", "cpu", "--json"])
    assert offload["verdict"] == "fits"


def test_form_strings_and_flag_spellings_give_the_same_run(client):
    as_form = {k: str(v) for k, v in QWEN.items()} | {"zero": "3", "seq": "128"}
    del as_form["zero_stage"], as_form["seq_len"]
    assert client.post("/api/estimate", json=as_form).json() == client.post("/api/estimate", json=QWEN).json()


def test_plan_is_the_cli_document(client):
    r = client.post("/api/plan", json=QWEN | {"top": 3})
    assert r.status_code == 200
    doc = r.json()
    cli = cli_json(["plan", *QWEN_FLAGS, "--top", "3", "--json"])
    # the command a terminal user pastes next is the CLI's own; the page applies a row with a button instead
    assert cli.pop("next_command").startswith("memfit estimate ") and doc == cli
    assert doc["schema"] == "memfit.plan/1" and doc["rows"] and all(row["verdict"] != "oom" for row in doc["rows"])


def test_plan_table_is_the_plan_document(client):
    """The page's plan view: one row for the start and one per configuration of /api/plan's document."""
    doc = client.post("/api/plan", json=QWEN | {"top": 3}).json()
    r = client.post("/api/plan.html", json=QWEN | {"top": 3})
    assert r.status_code == 200 and r.text.startswith('<table id="plan-table">')
    assert r.text.count("</tr>") - 1 == 1 + len(doc["rows"])  # the header row, the start, the plans
    bad = client.post("/api/plan.html", json=QWEN | {"micro_batch": 0})
    assert bad.status_code == 422 and bad.json()["field"] == "micro_batch"


def test_import_reads_the_uploaded_text_and_shows_only_the_name(client):
    r = client.post("/api/import", json={"name": "../../etc/" + LLAMA_YAML.name, "text": LLAMA_YAML.read_text()})
    assert r.status_code == 200
    doc = r.json()
    assert doc["name"] == LLAMA_YAML.name and doc["format"] == "llamafactory"
    assert doc["model"] == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert doc["knobs"]["tuning"] == "lora" and doc["knobs"]["lora_rank"] == 8 and doc["knobs"]["seq_len"] == 2048
    assert doc["knobs"]["micro_batch"] == 1 and doc["knobs"]["grad_accum"] == 8
    assert all("../" not in note and "<llamafactory text>" not in note for note in doc["notes"])


def test_export_deepspeed_says_the_run(client):
    r = client.post("/api/export", json=QWEN | {"offload_optimizer": "cpu", "format": "deepspeed"})
    assert r.status_code == 200
    (file,) = r.json()["files"]
    ds = json.loads(file["text"])
    assert file["name"] == "ds_config.json"
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


def test_export_llamafactory_gives_its_deepspeed_file_too(client):
    r = client.post("/api/export", json=QWEN | {"format": "llamafactory"})
    names = [f["name"] for f in r.json()["files"]]
    assert r.status_code == 200 and names[0] == "train.yaml" and names[1].endswith(".json")
    assert f"deepspeed: {names[1]}" in r.json()["files"][0]["text"]


def test_report_and_chart_are_the_html_report(client):
    report = client.post("/api/report.html", json=QWEN)
    assert report.status_code == 200 and report.headers["content-type"].startswith("text/html")
    assert report.text.startswith("<!DOCTYPE html>") and 'id="per-rank"' in report.text and "<script" not in report.text
    chart = client.post("/api/chart", json=QWEN).text
    assert chart.startswith('<div class="verdict oom" id="verdict">') and "<svg" in chart


def test_page_and_openapi(client):
    page = client.get("/")
    assert page.status_code == 200 and '<form id="knobs"' in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing fetched from elsewhere
    spec = client.get("/openapi.json").json()
    assert set(spec["paths"]) >= {"/api/estimate", "/api/plan", "/api/import", "/api/export", "/api/report.html"}
    props = spec["paths"]["/api/estimate"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert props["zero_stage"]["type"] == "integer" and "from_file" not in props


def test_uploaded_config_json_is_a_model(client):
    r = client.post("/api/estimate", json=QWEN | {"model": TINY_CONFIG, "model_name": "../../secret/config.json"})
    assert r.status_code == 200
    assert r.json()["model"] == "config.json"  # the name is shown, its folders dropped
    assert r.json()["params"]["total"] < 50e6


# ---------------------------------------------------------------- malformed, oversized, hostile


def test_malformed_json_is_400(client):
    refused(client.post("/api/estimate", content=b'{"model": ', headers=JSON), 400, None, "malformed JSON")
    refused(client.post("/api/estimate", content=b"[" * 50_000, headers=JSON), 400, None, "nested too deeply")
    refused(client.post("/api/estimate", json=["qwen2-7b"]), 422, None, "JSON object")


def test_oversized_body_is_413(client):
    refused(client.post("/api/estimate", content=b" " * (2**20 + 1), headers=JSON), 413, None, "limit")
    chunks = (b" " * 65536 for _ in range(17))  # no Content-Length: counted as it streams in
    refused(client.post("/api/estimate", content=chunks, headers=JSON), 413, None, "limit")
    small = app_client(max_body=1000)
    refused(small.post("/api/import", json={"name": "a.yaml", "text": "x: 1\n" * 500}), 413, None, "limit")


def test_path_traversal_in_names_reaches_no_file(client):
    refused(client.post("/api/estimate", json=QWEN | {"model": "../../etc/passwd"}), 422, "model", "reads no paths")
    refused(client.post("/api/estimate", json=QWEN | {"model": "/etc/hostname"}), 422, "model", "reads no paths")
    refused(client.post("/api/estimate", json=QWEN | {"from_file": "/etc/passwd"}), 422, "from_file", "not accepted")
    refused(client.post("/api/estimate", json=QWEN | {"machine": "/etc/passwd"}), 422, "machine", "not accepted")
    named = {"name": "x.yaml", "text": "stage: sft\nfinetuning_type: lora\ndeepspeed: ../../etc/passwd\n"}
    refused(client.post("/api/import", json=named), 422, "text", "does not read")
    # text that memfit's readers would take for a path (no newline) is read as text
    refused(client.post("/api/import", json={"name": "a.yaml", "text": "/etc/passwd"}), 422, "text", "a.yaml")


def test_huge_numbers_are_422(client):
    refused(client.post("/api/estimate", json=QWEN | {"seq_len": 10**400}), 422, "seq_len", "whole number")
    refused(client.post("/api/estimate", json=QWEN | {"micro_batch": 2**40}), 422, "micro_batch", "within")
    big = b'{"model": "qwen2-7b", "gpu": "rtx4090", "ratio": 1e999}'
    refused(client.post("/api/estimate", content=big, headers=JSON), 422, "ratio", "within")
    refused(client.post("/api/estimate", json=QWEN | {"gpus": 10**12}), 422, "gpus_per_node", "within")
    refused(client.post("/api/estimate", content=b'{"seq_len": 1' + b"0" * 5000 + b"}", headers=JSON), 400, None, "digits")


def test_yaml_bomb_is_refused_in_one_line(client):
    levels = ["&l0 [" + ", ".join(["x"] * 10) + "]"]
    levels += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 9)]  # 10^9 leaves if expanded
    text = f"distributed_type: MULTI_GPU\nnum_processes: [{', '.join(levels)}]\n"
    refused(client.post("/api/import", json={"name": "bomb.yaml", "text": text}), 422, "text", "aliases")


def test_bad_values_name_their_field(client):
    refused(client.post("/api/estimate", json=QWEN | {"micro_batch": 0}), 422, "micro_batch", "positive")
    refused(client.post("/api/estimate", json=QWEN | {"micro_batch": "four"}), 422, "micro_batch", "whole number")
    refused(client.post("/api/estimate", json=QWEN | {"attention": "fast"}), 422, "attention", "choose one of")
    refused(client.post("/api/estimate", json=QWEN | {"gpu": "rtx9999"}), 422, "gpu", "unknown GPU")
    refused(client.post("/api/estimate", json=QWEN | {"model": "no-such-model"}), 422, "model", "unknown model")
    refused(client.post("/api/estimate", json=QWEN | {"bogus": 1}), 422, "bogus", "unknown field")
    refused(client.post("/api/export", json=QWEN | {"format": "exe"}), 422, "format", "choose one of")
    refused(client.post("/api/plan", json=QWEN | {"top": -1}), 422, "top", "positive")
    refused(client.get("/api/nothing"), 404, None, "not found")


def test_an_imported_setting_memfit_cannot_read_caps_the_web_verdict_as_on_the_command_line(client):
    # NEFTune may raise memory (not modelled): the CLI caps the verdict; the page sends /api/import's "unread" back
    text = LLAMA_YAML.read_text() + "neftune_noise_alpha: 5\n"
    doc = client.post("/api/import", json={"name": "train.yaml", "text": text}).json()
    assert doc["unread"] and all("neftune" in line for line in doc["unread"])
    body = {"model": doc["model"], "gpu": "a100-80gb", **doc["knobs"], "profile": doc["profile"]}
    assert client.post("/api/estimate", json=body).json()["verdict"] == "fits"
    capped = client.post("/api/estimate", json=body | {"unread": doc["unread"]}).json()
    assert capped["verdict"] == "tight" and any(a.startswith("not read:") for a in capped["assumptions"])
    bad = client.post("/api/estimate", json=body | {"unread": "neftune"})
    assert bad.status_code == 422 and bad.json()["field"] == "unread"
