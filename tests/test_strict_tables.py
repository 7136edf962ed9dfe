"""Fact tables load strictly: a mistyped key in any shipped table is a one-line error naming the file, the row
and the nearest valid key, never a silent default (a model row with `qkv_bais = true` once loaded as a model
without bias). Every shipped table loads."""
from __future__ import annotations

import shutil
import tomllib

import pytest

from memfit.errors import MemfitError
from memfit.facts import catalog, frameworks, gpu_catalog

DATA = catalog.HERE


def _one_line(err: MemfitError) -> str:
    text = str(err)
    assert "\n" not in text
    return text


@pytest.fixture
def data_copy(tmp_path, monkeypatch):
    """The shipped data folder copied, the loaders pointed at the copy, their caches cleared before and after."""
    copy = tmp_path / "data"
    shutil.copytree(DATA, copy)
    loaders = (catalog.architectures, catalog.models, catalog.gpus, frameworks.frameworks)
    for f in loaders:
        f.cache_clear()
    monkeypatch.setattr(catalog, "HERE", copy)
    monkeypatch.setattr(gpu_catalog, "HERE", copy)
    monkeypatch.setattr(frameworks, "FOLDER", copy / "frameworks")
    yield copy
    for f in loaders:
        f.cache_clear()


def _mistype(path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_every_shipped_table_loads_strictly():
    assert catalog.architectures() and catalog.models() and catalog.gpus() and frameworks.frameworks()


def test_a_mistyped_model_key_names_the_row_and_the_nearest_key(data_copy):
    _mistype(data_copy / "models" / "qwen.toml", "\nvocab_size =", "\nvocab_sise =")
    with pytest.raises(MemfitError) as e:
        catalog.models()
    text = _one_line(e.value)
    assert "qwen.toml:" in text and "'vocab_sise'" in text and "did you mean 'vocab_size'" in text


def test_a_mistyped_family_key_names_the_family(data_copy):
    _mistype(data_copy / "architectures.toml", "qkv_bias = true", "qkv_biass = true")
    with pytest.raises(MemfitError) as e:
        catalog.architectures()
    assert "architectures.toml [" in _one_line(e.value) and "did you mean 'qkv_bias'" in str(e.value)


def test_a_mistyped_gpu_key_or_choice_is_refused(data_copy):
    path = data_copy / "gpus.toml"
    _mistype(path, "memory_bandwidth_gbps = 936", "memory_bandwith_gbps = 936")
    with pytest.raises(MemfitError) as e:
        catalog.gpus()
    assert "gpus.toml:rtx3090" in _one_line(e.value) and "did you mean 'memory_bandwidth_gbps'" in str(e.value)
    shutil.copy(DATA / "gpus.toml", path)
    catalog.gpus.cache_clear()
    _mistype(path, 'memory_basis = "torch"', 'memory_basis = "smi"')
    with pytest.raises(MemfitError) as e:
        catalog.gpus()
    assert "choose one of: torch, nvidia-smi" in _one_line(e.value)


def test_a_mistyped_profile_table_or_default_knob_is_refused(data_copy):
    path = data_copy / "frameworks" / "trl.toml"
    _mistype(path, "\n[defaults]\n", "\n[default]\n")
    with pytest.raises(MemfitError) as e:
        frameworks.frameworks()
    assert "frameworks/trl.toml" in _one_line(e.value) and "did you mean 'defaults'" in str(e.value)
    shutil.copy(DATA / "frameworks" / "trl.toml", path)
    frameworks.frameworks.cache_clear()
    doc = tomllib.loads(path.read_text())
    knob = next(iter(doc["defaults"]))
    _mistype(path, f"\n{knob} =", f"\n{knob}x =")
    with pytest.raises(MemfitError) as e:
        frameworks.frameworks()
    assert f"'{knob}x'" in _one_line(e.value) and f"did you mean '{knob}'" in str(e.value)


def test_an_nvidia_smi_memory_figure_becomes_what_torch_can_allocate():
    with open(DATA / "gpus.toml", "rb") as f:
        doc = tomllib.load(f)
    hidden = doc["memory_basis"]["nvidia-smi"]["hidden_mib"] * 2**20
    smi = [g for g in doc["gpu"] if g.get("memory_basis") == "nvidia-smi"]
    assert smi
    for row in smi:
        g = catalog.find_gpu(row["id"])
        assert g.listed_memory_bytes == row["memory_bytes"] and g.memory_bytes == row["memory_bytes"] - hidden
    torch_row = next(g for g in doc["gpu"] if g.get("memory_basis", "torch") == "torch")
    assert catalog.find_gpu(torch_row["id"]).memory_bytes == torch_row["memory_bytes"]
