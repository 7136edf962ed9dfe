"""A hub id the catalog does not list is read through huggingface_hub, here always offline: each test lays out
the library's own cache (models--org--name/refs, snapshots/<commit>/) from local files, and the real library
finds them there with HF_HUB_OFFLINE set. Nothing here reaches the network."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from memfit.errors import MemfitError
from memfit.facts import hub
from memfit.facts.catalog import _hub_model, find_gpu, find_model, models
from memfit.facts.profiles import build_scenario
from memfit.facts.scenario import Hardware
from memfit.memory.inventory import count_params
from memfit.roles.estimate import estimate

# config.json shapes as transformers writes them: a family memfit knows, and one it does not
QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "num_hidden_layers": 4,
         "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
         "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu",
         "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
BRAND_NEW = {"model_type": "brand_new_lm", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
             "intermediate_size": 2816, "vocab_size": 32000, "hidden_act": "silu"}


def put_in_cache(cache: Path, repo_id: str, files: Path, ref: str = "main") -> Path:
    """The files of `files` as huggingface_hub stores a download of `repo_id` at `ref`; returns the snapshot."""
    commit = hashlib.sha1(f"{repo_id}@{ref}".encode()).hexdigest()
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    shutil.copytree(files, repo / "snapshots" / commit)
    return repo / "snapshots" / commit


def config_folder(path: Path, config: dict) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty HF cache, offline; huggingface_hub read these variables at import, so its constants are set too."""
    constants = pytest.importorskip("huggingface_hub.constants")
    cache = tmp_path / "hf" / "hub"
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    _hub_model.cache_clear()
    yield cache
    _hub_model.cache_clear()


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfit.interfaces.cli.main", *argv], capture_output=True,
                          text=True, env=os.environ.copy(), timeout=120)


def assumptions(spec) -> list[str]:
    hw = Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=1)
    return estimate(build_scenario(spec, hw, {"tuning": "full"})).assumptions


def test_a_cached_hub_repo_reads_like_the_same_local_config(hf_cache, tmp_path):
    local = config_folder(tmp_path / "local", QWEN2)
    put_in_cache(hf_cache, "acme/tiny-qwen", local)
    spec = find_model("acme/tiny-qwen")
    assert spec.id == "acme/tiny-qwen" and spec.arch == find_model(str(local)).arch
    assert count_params(spec) == count_params(find_model(str(local)))
    assert spec.hub_param_count is None  # offline, no weights cached: nothing to check against


def test_a_revision_after_at_reads_that_revision(hf_cache, tmp_path):
    put_in_cache(hf_cache, "acme/tiny-qwen", config_folder(tmp_path / "main", QWEN2))
    deeper = config_folder(tmp_path / "v2", QWEN2 | {"num_hidden_layers": 8})
    put_in_cache(hf_cache, "acme/tiny-qwen", deeper, ref="v2")
    assert find_model("acme/tiny-qwen@v2").num_layers == 8
    assert find_model("acme/tiny-qwen").num_layers == 4
    assert count_params(find_model("acme/tiny-qwen@v2")) == count_params(find_model(str(deeper)))


def test_the_cli_estimates_a_hub_model_of_an_unknown_family_and_says_what_it_assumed(hf_cache, tmp_path):
    local = config_folder(tmp_path / "local", BRAND_NEW)
    put_in_cache(hf_cache, "acme/brand-lm", local)
    out = run_cli("estimate", "acme/brand-lm", "--gpu", "a100-80gb", "--tuning", "lora", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["params"]["total"] == count_params(find_model(str(local)))
    assert any("brand_new_lm" in a for a in doc["assumptions"])  # the family guess reaches the printed list


def test_a_repo_not_in_the_cache_offline_is_one_line_naming_hf_hub_offline(hf_cache):
    out = run_cli("estimate", "acme/not-cached", "--gpu", "a100-80gb")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "HF_HUB_OFFLINE is set and acme/not-cached is not in the HF cache" in out.stderr


def test_an_invalid_hub_id_is_refused_by_the_library_in_one_line(hf_cache):
    with pytest.raises(MemfitError, match="not a valid Hugging Face hub id"):
        find_model("acme/bad..name")


def test_a_catalog_name_never_touches_the_hub(monkeypatch):
    def no_hub(*args):
        raise AssertionError("the catalog answers this name")

    monkeypatch.setattr(hub, "config_path", no_hub)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    for name in ("Qwen/Qwen2-7B-Instruct", "qwen2-7b", "someone/Qwen2-7B"):
        found = find_model(name)  # a catalog row; a hub id keeps the id the user gave (catalog.as_named)
        assert any(replace(found, id=row.id) == row for row in models())
        assert found.id == (name if "/" in name else "Qwen/Qwen2-7B")


def test_without_the_extra_the_error_says_how_to_get_it_and_keeps_did_you_mean(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # what `import huggingface_hub` does when absent
    _hub_model.cache_clear()
    with pytest.raises(MemfitError) as e:
        find_model("Qwen/Qwen2-7B-Instrct")
    message = str(e.value)
    assert message.startswith("unknown model 'Qwen/Qwen2-7B-Instrct': not in the catalog; install memfit[hub]")
    assert "did you mean: qwen/qwen2-7b-instruct" in message and "\n" not in message


def test_a_local_config_of_an_unknown_family_reaches_the_assumptions(tmp_path):
    spec = find_model(str(config_folder(tmp_path / "m", BRAND_NEW | {"hidden_act": "swishglu"})))
    printed = assumptions(spec)
    assert all(a in printed for a in spec.assumed) and len(spec.assumed) == 2


def test_a_count_memfit_stored_earlier_is_used_offline(hf_cache, tmp_path):
    snapshot = put_in_cache(hf_cache, "acme/tiny-qwen", config_folder(tmp_path / "m", QWEN2))
    ours = count_params(find_model(str(snapshot)))
    hub._save_count(f"acme/tiny-qwen@{snapshot.name}", ours + 1000)  # as the hub's API would have told it
    assert (tmp_path / "xdg" / "memfit" / "hub.json").is_file()
    spec = find_model("acme/tiny-qwen")
    assert spec.hub_param_count == ours + 1000
    assert any(f"hold {ours + 1000:,}" in a and f"{ours:,} counted" in a for a in assumptions(spec))


def _tiny_checkpoint(folder: Path, shard: str) -> int:
    """A real Qwen2 checkpoint written by transformers (config.json + safetensors); its parameter count."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder, max_shard_size=shard)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("shard", ["10GB", "100KB"])  # one model.safetensors; an index and several shards
def test_cached_safetensors_give_the_checkpoint_count_which_matches_memfit(hf_cache, tmp_path, shard):
    real = _tiny_checkpoint(tmp_path / "ckpt", shard)
    snapshot = put_in_cache(hf_cache, "acme/tiny-ckpt", tmp_path / "ckpt")
    assert (snapshot / "model.safetensors.index.json").is_file() == (shard == "100KB")
    spec = find_model("acme/tiny-ckpt")
    assert spec.hub_param_count == real == count_params(spec)
    assert not any(a.startswith("parameters:") for a in assumptions(spec))


def test_a_checkpoint_that_disagrees_with_its_config_shows_under_assumed(hf_cache, tmp_path):
    real = _tiny_checkpoint(tmp_path / "ckpt", "10GB")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    put_in_cache(hf_cache, "acme/tiny-ckpt", tmp_path / "ckpt")
    spec = find_model("acme/tiny-ckpt")
    assert count_params(spec) > real
    assert any(a.startswith("parameters:") and f"hold {real:,}" in a for a in assumptions(spec))


def test_a_partly_downloaded_sharded_checkpoint_gives_no_count(hf_cache, tmp_path):
    _tiny_checkpoint(tmp_path / "ckpt", "100KB")
    next((tmp_path / "ckpt").glob("model-*.safetensors")).unlink()
    put_in_cache(hf_cache, "acme/tiny-ckpt", tmp_path / "ckpt")
    assert find_model("acme/tiny-ckpt").hub_param_count is None


def test_an_unreachable_hub_is_one_line_without_the_librarys_retry_warnings(monkeypatch):
    """huggingface_hub logs a warning per retry of an unreachable hub; memfit's one line says the outcome instead.
    (The download is replaced by what the library does with no network: warn, then raise; this machine has none.)"""
    import logging

    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def unreachable(*args, **kwargs):
        logging.getLogger("huggingface_hub.utils._http").warning("'[Errno -2]' thrown while requesting HEAD")
        raise LocalEntryNotFoundError("no connection")

    import io

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    seen = io.StringIO()
    http = logging.getLogger("huggingface_hub.utils._http")
    handler = logging.StreamHandler(seen)
    http.addHandler(handler)
    try:
        with pytest.raises(MemfitError, match="cannot reach the Hugging Face hub") as err:
            hub.config_path("someone/unlisted-model", None)
    finally:
        http.removeHandler(handler)
    assert "\n" not in str(err.value) and seen.getvalue() == ""
    assert logging.getLogger("huggingface_hub").level != logging.ERROR  # the level is given back


@pytest.fixture
def unreachable_hub(hf_cache, monkeypatch):
    """The HF cache of `hf_cache` with HF_HUB_OFFLINE unset and the hub at an endpoint nothing answers: a
    blackholed address (RFC 5737 TEST-NET-1) whose connect hangs, so the reachability check's timeout is what
    ends it, on a machine with a network as on one without."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://192.0.2.1")
    monkeypatch.setattr(constants, "ENDPOINT", "https://192.0.2.1")
    hub._reach.clear()
    yield hf_cache
    hub._reach.clear()


def test_an_unreachable_hub_fails_fast_with_one_line_saying_offline(unreachable_hub):
    import time

    start = time.monotonic()
    with pytest.raises(MemfitError) as err:
        find_model("acme/not-cached")
    assert time.monotonic() - start < 2  # the library's own retries take ~25 s
    message = str(err.value)
    assert "offline: using the HF cache only" in message and "192.0.2.1" in message and "\n" not in message
    assert hub._reach == {("192.0.2.1", 443): False}  # checked once, and remembered


def test_an_unreachable_hub_still_reads_what_the_cache_holds(unreachable_hub, tmp_path):
    put_in_cache(unreachable_hub, "acme/tiny-qwen", config_folder(tmp_path / "m", QWEN2))
    assert find_model("acme/tiny-qwen").num_layers == QWEN2["num_hidden_layers"]


def test_the_cli_on_an_unreachable_hub_is_one_line_and_never_a_traceback(unreachable_hub):
    out = run_cli("estimate", "acme/not-cached", "--gpu", "a100-80gb")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "offline: using the HF cache only" in out.stderr


def test_the_reachability_check_connects_through_the_proxy_the_library_would_use(unreachable_hub, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "")
    assert hub._address() == ("proxy.internal", 3128)
    monkeypatch.delenv("HTTPS_PROXY")
    assert hub._address() == ("192.0.2.1", 443)


def test_offline_mode_says_it_uses_the_cache_only(hf_cache):
    with pytest.raises(MemfitError, match="offline: using the HF cache only: HF_HUB_OFFLINE is set"):
        find_model("acme/not-cached")
