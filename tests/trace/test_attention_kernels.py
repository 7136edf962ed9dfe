"""Which attention kernels transformers has for each family (architectures.toml has_sdpa / has_flash) is the installed
release's own class flags, and a kernel a family lacks is never costed: transformers falls back to eager for a
default, refuses one asked for by name."""
import tomllib
import warnings
from pathlib import Path

import pytest

from memfit.errors import MemfitError
from memfit.facts.catalog import ARCH_DEFAULTS, find_gpu, find_model
from memfit.facts.profiles import build_scenario
from memfit.facts.scenario import Hardware
from memfit.roles.estimate import estimate

ARCHITECTURES = tomllib.loads((Path(__file__).resolve().parents[2] / "memfit/facts/data/architectures.toml").read_text())


def _kernels_by_family() -> dict:
    """family -> (has sdpa, has flash) by the installed transformers: a family has a kernel when one of its model
    types' CausalLM class does (gemma3's multimodal class lacks flash, its text class has it)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for family, facts in ARCHITECTURES.items():
            classes = [getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[t], None)
                       for t in facts.get("hf_model_types", []) if t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]
            classes = [c for c in classes if c is not None]
            if classes:
                out[family] = (any(c._supports_sdpa for c in classes), any(c._supports_flash_attn for c in classes))
    return out


def test_each_familys_kernels_are_the_installed_transformers_flags():
    found = _kernels_by_family()
    assert len(found) >= 20
    said = {f: (ARCHITECTURES[f].get("has_sdpa", ARCH_DEFAULTS["has_sdpa"]),
                ARCHITECTURES[f].get("has_flash", ARCH_DEFAULTS["has_flash"])) for f in found}
    assert said == found


def _scenario(model: str, given: dict):
    return build_scenario(find_model(model), Hardware(gpu=find_gpu("a100-80gb")), {"tuning": "lora", **given},
                          "hf-trainer", typed=tuple(given))


def test_a_default_kernel_the_family_lacks_is_costed_as_eager_and_said():
    bloom = _scenario("bigscience/bloomz-7b1", {"seq_len": 4096})
    assert bloom.attention == "eager" and any("no sdpa attention for bloom" in a for a in bloom.assumed)
    assert estimate(bloom).device_total.peak.total == estimate(_scenario("bigscience/bloomz-7b1", {
        "seq_len": 4096, "attention": "eager"})).device_total.peak.total


def test_a_kernel_typed_for_a_family_without_it_is_refused():
    with pytest.raises(MemfitError, match="--attention sdpa: .* no sdpa attention for bloom models; valid: eager$"):
        _scenario("bigscience/bloomz-7b1", {"attention": "sdpa"})
    assert _scenario("google/gemma-2-9b", {"attention": "flash"}).attention == "flash"  # Gemma 2 has flash
