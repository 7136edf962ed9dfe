"""`memfit serve` on the user's machine (issue 31): a YAML alias bomb through every upload and form field is
refused fast and small; the API answers only JSON from its own page on a localhost name; a non-loopback --host
needs --allow-remote; a slow request does not hold up another. Through FastAPI's TestClient (no network)."""
from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

pytest.importorskip("fastapi", reason="memfit[serve] is not installed")
from fastapi.testclient import TestClient  # noqa: E402

from memfit.errors import MemfitError  # noqa: E402
from memfit.interfaces.cli.main import main  # noqa: E402
from memfit.interfaces.cli.serve import check_remote, served_names  # noqa: E402
from memfit.interfaces.serve.app import create_app  # noqa: E402
from memfit.interfaces.serve.requests import spellings  # noqa: E402

FORMATS = Path(__file__).resolve().parent.parent / "formats"
LLAMA_YAML = FORMATS / "examples" / "llamafactory" / "examples" / "train_lora" / "llama3_lora_sft.yaml"
# one file per YAML format the server reads (accelerate's names its DeepSpeed file: the issue's 683-byte upload)
UPLOADS = [FORMATS / "examples" / "accelerate" / "deepspeed_config_file.yaml",
           FORMATS / "examples" / "accelerate" / "fsdp2_config.yaml", LLAMA_YAML,
           FORMATS / "examples" / "hf" / "sft_lora_config.yaml",
           FORMATS / "axolotl_examples" / "fft-8b-liger-fsdp2.yaml",
           FORMATS / "llamafactory_v1_examples" / "lora_sft_fsdp2.yaml"]
QWEN = {"model": "Qwen/Qwen2-7B-Instruct", "gpu": "rtx4090", "gpus": 4, "profile": "openrlhf", "tuning": "full",
        "zero_stage": 3, "precision": "bf16-mixed", "checkpointing": "full", "attention": "flash", "seq_len": 128,
        "micro_batch": 4}
EVIL = "http://evil.example"


def alias_bomb(levels: int = 9) -> str:
    """A flow list whose last item expands to 10^levels strings: a few hundred bytes, shared references when
    parsed, and gigabytes for anything that walks, reprs or serialises it copy by copy."""
    items = ["&l0 [" + ", ".join(["lol"] * 10) + "]"]
    items += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(allowed_hosts=("testserver",))) as c:  # one event loop for all (the threads test)
        yield c


def bounded(send) -> tuple:
    """The answer of send(), with the time it took and the peak memory Python allocated meanwhile."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        r = send()
        return r, time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def refused_fast(send, status: int = 422, needle: str = "") -> str:
    r, seconds, peak = bounded(send)
    body = r.json()
    assert r.status_code == status, body
    assert set(body) == {"error", "field"} and "\n" not in body["error"] and len(body["error"]) <= 500
    assert needle.lower() in body["error"].lower(), body["error"]
    assert seconds < 1.0 and peak < 100 * 2**20, (seconds, peak)
    return body["error"]


# ---------------------------------------------------------------- alias bombs


def with_bomb(path: Path, key: tuple) -> str:
    """The file with the value at `key` (a path of mapping keys) replaced by the alias bomb."""
    doc = yaml.safe_load(path.read_text())
    holder = doc
    for k in key[:-1]:
        holder = holder[k]
    holder[key[-1]] = "BOMB-HERE"
    return yaml.safe_dump(doc, sort_keys=False).replace("BOMB-HERE", alias_bomb())


def keys_of(doc: dict, above: tuple = ()):
    for key, value in doc.items():
        yield above + (key,)
        if isinstance(value, dict):
            yield from keys_of(value, above + (key,))


@pytest.mark.parametrize("path", UPLOADS, ids=lambda p: p.name)
def test_alias_bomb_in_any_setting_of_an_upload_is_refused_fast(client, path):
    for key in keys_of(yaml.safe_load(path.read_text())):
        text = with_bomb(path, key)
        assert len(text) < 3000
        refused_fast(lambda text=text: client.post("/api/import", json={"name": path.name, "text": text}),
                     needle="aliases")


def test_the_issues_683_byte_accelerate_upload_is_refused_fast(client):
    text = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_processes: 8\n"
            f"deepspeed_config:\n  deepspeed_config_file: {alias_bomb()}\n")
    assert len(text) < 700
    line = refused_fast(lambda: client.post("/api/import", json={"name": "acc.yaml", "text": text}), needle="aliases")
    assert line.startswith("acc.yaml: ")
    # a self-referring alias (a list holding itself) is bounded the same way
    loop = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: &me [*me, *me]\n"
    refused_fast(lambda: client.post("/api/import", json={"name": "loop.yaml", "text": loop}), needle="aliases")


def test_a_few_aliases_of_a_real_config_are_still_read(client):
    text = LLAMA_YAML.read_text().replace("per_device_train_batch_size: 1", "per_device_train_batch_size: &mb 1")
    text += "per_device_eval_batch_size: *mb\n"
    r = client.post("/api/import", json={"name": "train.yaml", "text": text})
    assert r.status_code == 200, r.json()
    assert r.json()["knobs"]["micro_batch"] == 1


def test_a_reader_tripping_on_a_value_type_answers_one_line(client):
    # LLaMA-Factory v1's reader calls float() on lora_dropout: a list there once gave a bare 500
    path = FORMATS / "llamafactory_v1_examples" / "lora_sft_fsdp2.yaml"
    text = path.read_text().replace("lora_dropout: 0.05", "lora_dropout: [1, 2]")
    assert "lora_dropout: [1, 2]" in text
    refused_fast(lambda: client.post("/api/import", json={"name": path.name, "text": text}), needle=path.name)


def test_bomb_text_in_every_form_field_is_refused_fast(client):
    """JSON has no aliases, but the bomb's text (and deep or wide values) in each knob, planner and export field
    still gets a short one-line answer: no message quotes more than a few dozen characters of a value."""
    text = alias_bomb()
    wide, deep = ["lol"] * 5_000, [[[[[[[[["lol"] * 10] * 10] * 10] * 10]]]]]
    # every knob goes through requests.scenario, which /api/plan and /api/export share with /api/estimate
    for name in sorted(set(spellings().values()) - {"from_file", "machine", "framework_version"}):
        for value in (text, wide, deep):
            r, seconds, _ = bounded(lambda n=name, v=value: client.post("/api/estimate", json=QWEN | {n: v}))
            assert r.status_code in (200, 422) and seconds < 1.0, (name, r.text[:200])
            if r.status_code == 422:
                assert "\n" not in r.json()["error"] and len(r.json()["error"]) <= 500
                assert "lol', 'lol', 'lol', 'lol', 'lol'" not in r.json()["error"]  # cut short before formatting
    for key, value in (("top", wide), ("global_batch", deep), ("allow", text), ("format", wide), ("model", text)):
        endpoint = "/api/plan" if key != "format" else "/api/export"
        refused_fast(lambda e=endpoint, k=key, v=value: client.post(e, json=QWEN | {k: v}))
    refused_fast(lambda: client.post("/api/estimate", json=QWEN | {"model": {"model_type": wide}}))
    refused_fast(lambda: client.post("/api/import", json={"name": text, "text": wide}))


# ---------------------------------------------------------------- origin, content type, Host


def test_a_cross_origin_text_plain_post_is_refused(client):
    """What any web page can send without a CORS preflight: a text/plain body from its own origin."""
    body = '{"model": "qwen2-7b", "gpu": "rtx4090"}'
    plain = {"content-type": "text/plain", "origin": EVIL}
    refused_fast(lambda: client.post("/api/estimate", content=body, headers=plain), 403, "Origin 'http://evil.example'")
    refused_fast(lambda: client.post("/api/estimate", json=QWEN, headers={"origin": EVIL}), 403, "cross-origin")
    refused_fast(lambda: client.post("/api/import", json={"text": "a: 1\n"}, headers={"origin": "null"}), 403)
    refused_fast(lambda: client.get("/", headers={"origin": EVIL}), 403, "cross-origin")
    # from its own origin, a body that is not JSON is still refused, naming what to send
    own = {"content-type": "text/plain", "origin": "http://testserver"}
    refused_fast(lambda: client.post("/api/estimate", content=body, headers=own), 415, "application/json")
    refused_fast(lambda: client.post("/api/estimate", content=body), 415, "got none")
    form = {"content-type": "application/x-www-form-urlencoded"}
    refused_fast(lambda: client.post("/api/estimate", content="model=qwen2-7b", headers=form), 415, "application/json")


def test_its_own_page_and_json_clients_are_answered(client):
    own = {"origin": "http://testserver"}
    assert client.get("/", headers=own).status_code == 200
    assert client.post("/api/estimate", json=QWEN, headers=own).json()["verdict"] == "oom"
    typed = {"content-type": "application/json; charset=utf-8"}
    assert client.post("/api/estimate", content=b'{"model": "qwen2-7b", "gpu": "rtx4090"}', headers=typed).status_code == 200
    assert client.get("/openapi.json").status_code == 200  # no Origin: curl, scripts


@pytest.mark.parametrize("host", ["localhost:8000", "127.0.0.1", "127.0.0.1:9", "[::1]:8000", "LOCALHOST"])
def test_localhost_names_are_answered(host):
    c = TestClient(create_app())
    origin = {"host": host, "origin": f"http://{host}".lower()}
    assert c.get("/", headers={"host": host}).status_code == 200
    assert c.post("/api/estimate", json=QWEN, headers=origin).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "testserver", "127.0.0.1.evil.example",
                                  "localhost.evil.example:8000", ""])
def test_a_foreign_host_header_is_refused(host):
    """A DNS-rebinding page reaches 127.0.0.1 under its own name: the Host header says so."""
    c = TestClient(create_app())
    line = refused_fast(lambda: c.get("/", headers={"host": host}), 403, "is not this server's address")
    assert "localhost" in line
    refused_fast(lambda: c.post("/api/estimate", json=QWEN, headers={"host": host}), 403, "Host")


def test_the_bound_address_is_answered():
    c = TestClient(create_app(allowed_hosts=("192.168.1.7",)))
    assert c.get("/", headers={"host": "192.168.1.7:8000"}).status_code == 200
    assert c.get("/", headers={"host": "192.168.1.8:8000"}).status_code == 403


def test_a_wildcard_bound_server_answers_the_address_it_was_reached_at():
    """Bound to 0.0.0.0, a connection arrives at one of the machine's addresses (ASGI's scope["server"])."""
    from memfit.interfaces.serve.limits import SameOrigin

    guard = SameOrigin(app=None)
    scope = {"type": "http", "method": "GET", "server": ("192.168.1.7", 8000), "scheme": "http"}
    assert guard.refusal(scope | {"headers": [(b"host", b"192.168.1.7:8000")]}) is None
    assert guard.refusal(scope | {"headers": [(b"host", b"evil.example:8000")]})[0] == 403
    assert guard.refusal(scope | {"headers": [(b"host", b"192.168.1.8:8000")]})[0] == 403


# ---------------------------------------------------------------- --host


def run_cli(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_remote_host_needs_allow_remote(host):
    code, err = run_cli(["serve", "--host", host, "--port", "9"])  # refused before any socket is bound
    assert code == 2 and err.count("\n") == 1
    assert f"--host {host}" in err and "no login" in err and "--allow-remote" in err
    warning = check_remote(host, allow_remote=True)
    assert "no login" in warning and "\n" not in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_a_loopback_host_starts_without_a_word(host):
    assert check_remote(host, allow_remote=False) is None


def test_an_unknown_host_is_one_line():
    with pytest.raises(MemfitError, match="no such address"):
        check_remote("no-such-host.invalid", allow_remote=True)


def test_the_app_answers_the_names_it_is_bound_to():
    assert served_names("127.0.0.2") == ("127.0.0.2",)
    assert socket.gethostname() in served_names("0.0.0.0")


# ---------------------------------------------------------------- one slow request


def test_an_estimate_is_answered_while_a_slow_upload_is_read(client):
    """A 200 KB YAML takes PyYAML seconds (the readers run in the thread pool, not the event loop): an estimate
    sent meanwhile is answered before it ends."""
    text = LLAMA_YAML.read_text() + "".join(f"x{i}: {i}\n" for i in range(16_000))
    done = threading.Event()
    slow = threading.Thread(target=lambda: (client.post("/api/import", json={"name": "t.yaml", "text": text}),
                                            done.set()))
    slow.start()
    try:
        time.sleep(0.3)  # the upload is being read
        start = time.perf_counter()
        assert client.post("/api/estimate", json=QWEN).status_code == 200
        seconds = time.perf_counter() - start
        assert not done.is_set(), "the upload was not slow enough to test anything"
        assert seconds < 1.5  # alone it takes milliseconds; the upload's thread shares the GIL with it
    finally:
        slow.join(60)
