"""Catalog facts: every model's derived parameter count matches its published count; names resolve."""
import pytest

from memfit.facts.catalog import find_gpu, find_model, gpus, models
from memfit.errors import MemfitError
from memfit.memory.inventory import count_params
from shared_cases import CASES as SHARED_CASES
from shared_support import shared as shared_file


@pytest.mark.parametrize("model", models(), ids=lambda m: m.id)
def test_derived_params_match_published_within_half_a_percent(model):
    assert model.published_params, f"{model.id} lacks published_params"
    assert model.params_source and model.config_source
    derived = count_params(model)
    assert abs(derived - model.published_params) / model.published_params <= 0.005, (derived, model.published_params)


def test_catalog_has_the_families_people_fine_tune():
    assert len(models()) >= 40
    ids = " ".join(m.id.lower() for m in models())
    for needle in ("llama-2", "llama-3-", "llama-3.1", "llama-3.2", "llama-3.3", "qwen-7b", "qwen1.5", "qwen2-",
                   "qwen2.5", "qwen3", "mistral", "gemma-2", "gemma-3", "glm-4", "phi-3", "phi-3.5", "phi-4",
                   "yi-", "deepseek-llm", "internlm2", "baichuan2", "falcon", "starcoder2", "santacoder", "olmo"):
        assert needle in ids, needle


@pytest.mark.parametrize("name", ["Qwen/Qwen2-7B-Instruct", "qwen/qwen2-7b-instruct", "Qwen2-7B-Instruct",
                                  "qwen2-7b-instruct", "SomeOrg/Qwen2-7B-Instruct"])
def test_names_resolve_case_insensitively_with_or_without_org(name):
    # base and Instruct checkpoints share one entry when their architecture is identical; a hub id keeps the
    # spelling the user gave (headers, titles and exported files say it), an alias names the row
    from dataclasses import replace

    found, base = find_model(name), find_model("Qwen/Qwen2-7B")
    assert replace(found, id=base.id) == base
    assert found.id == (name if "/" in name else base.id)
    assert found.hidden_size == 3584


def test_short_alias():
    assert find_model("qwen2-7b").hidden_size == 3584


def test_unknown_model_names_close_matches():
    with pytest.raises(MemfitError, match="did you mean"):
        find_model("llama-3.1-8bb")


def test_every_model_named_in_the_cases_is_in_the_catalog():
    import json
    import re

    shared = SHARED_CASES
    for file in ("published.jsonl", "user-reports.jsonl"):
        for line in shared_file(shared / file).read_text().splitlines():
            name = re.sub(r"\s*\(.*\)$", "", json.loads(line)["model"]).strip()
            find_model(name)


def test_gpu_catalog():
    assert len(gpus()) >= 20
    assert find_gpu("RTX 4090").memory_bytes == find_gpu("4090").memory_bytes
    assert 23.5 * 2**30 < find_gpu("rtx4090").memory_bytes < 24 * 2**30
    assert find_gpu("a100-80gb").compute_capability == 8.0
