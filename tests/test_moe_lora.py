"""LoRA on a mixture of experts: memfit's trainable parameters are PEFT's, on the installed transformers and PEFT.

transformers 5 stores the routed experts as stacked 3-D parameters, and what PEFT LoRA does with them depends
on the family (data/architectures.toml peft_stacked_experts, tied to the transformers range by data/releases.toml
moe_experts): on peft 0.21.2 Mixtral, Qwen3-MoE and DeepSeek-V2/V3 get LoRA on their experts through
target_parameters (gate and up fused, rank 2r), while Qwen2-MoE's experts get none (PEFT does not convert its
targets), only its shared expert's Linears. A tiny model of each family is built from its config.json with
transformers, adapted with peft.get_peft_model and the target_modules the trace would pass, and its
get_nb_trainable_parameters() compared with the inventory: a release that changes any of this fails here.
"""
import json
import warnings

import pytest

pytest.importorskip("peft")
torch = pytest.importorskip("torch")

from memfit.errors import MemfitError  # noqa: E402
from memfit.facts.catalog import find_model  # noqa: E402
from memfit.facts.releases import expert_lora  # noqa: E402
from memfit.memory.inventory import tuned_tensors  # noqa: E402
from memfit.trace.peft import lora_target_modules  # noqa: E402

_SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, vocab_size=256)
_MLA = dict(moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1, n_routed_experts=4)
FAMILIES = {  # model_type -> (config arguments, what PEFT does with its experts on the pinned releases)
    "mixtral": (dict(_SIZES, num_local_experts=4, num_experts_per_tok=2), "fused"),
    "qwen2_moe": (dict(_SIZES, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=80), "none"),
    "qwen3_moe": (dict(_SIZES, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16), "fused"),
    "deepseek_v2": (dict(_SIZES, num_experts_per_tok=2, **_MLA), "fused"),
    "deepseek_v3": (dict(_SIZES, num_experts_per_tok=2, **_MLA), "fused"),
}
RANK = 8


def _config(tmp_path, model_type):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = CONFIG_MAPPING[model_type](**FAMILIES[model_type][0])
    path = tmp_path / model_type / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(config.to_dict()))
    return config, path


def _peft_trainable(config, target_modules, dora=False) -> int:
    import peft
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config)
        lora = peft.LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=target_modules, use_dora=dora,
                               task_type="CAUSAL_LM")
        return peft.get_peft_model(model, lora).get_nb_trainable_parameters()[0]


def _installed() -> tuple[tuple[str, str], ...]:
    from importlib.metadata import version

    return (("transformers", version("transformers")),)  # out of every known range: refused, so this fails


def _memfit_trainable(spec, targets, dora=False) -> int:
    tensors = tuned_tensors(spec, "lora", RANK, targets, dora, releases=_installed())
    return sum(t.total for t in tensors if t.trainable)


def _mlp_and_attention_names(spec) -> tuple[str, ...]:
    return tuple(name for name, roles in spec.linear_names.items() if "router" not in roles)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
@pytest.mark.parametrize("targets", [("all-linear",), "names", ("q", "v", "down")])
def test_lora_on_a_moe_trains_what_peft_trains(tmp_path, model_type, targets):
    config, path = _config(tmp_path, model_type)
    spec = find_model(str(path))
    assert expert_lora(spec.arch, _installed()) == FAMILIES[model_type][1]
    targets = _mlp_and_attention_names(spec) if targets == "names" else targets
    peft_count = _peft_trainable(config, lora_target_modules(spec, spec.arch, targets))
    assert _memfit_trainable(spec, targets) == peft_count


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
def test_peft_refusals_on_stacked_experts_are_memfits(tmp_path, model_type):
    """PEFT cannot put DoRA on a stacked parameter, nor LoRA on half of the fused gate_up_proj."""
    config, path = _config(tmp_path, model_type)
    spec = find_model(str(path))
    for targets, dora in ((("all-linear",), True), (("q", "up", "down"), False)):
        with pytest.raises(ValueError):
            _peft_trainable(config, lora_target_modules(spec, spec.arch, targets), dora)
        with pytest.raises(MemfitError):
            _memfit_trainable(spec, targets, dora)


def test_qwen2_moe_dora_matches_peft(tmp_path):
    """No stacked expert is adapted, so DoRA works: its magnitude vectors are counted as PEFT counts them."""
    config, path = _config(tmp_path, "qwen2_moe")
    spec = find_model(str(path))
    targets = ("all-linear",)
    assert _memfit_trainable(spec, targets, True) == _peft_trainable(config, lora_target_modules(spec, spec.arch,
                                                                                                  targets), True)


def test_transformers_4_adapts_every_expert_as_a_linear():
    """transformers 4 kept one nn.Linear per expert and projection: LoRA of rank r on each (data/releases.toml)."""
    spec = find_model("Qwen/Qwen1.5-MoE-A2.7B")
    old = tuned_tensors(spec, "lora", RANK, ("all-linear",), releases=(("transformers", "4.57.1"),))
    now = tuned_tensors(spec, "lora", RANK, ("all-linear",))
    assert expert_lora(spec.arch, (("transformers", "4.57.1"),)) == "linear"
    assert any(".experts." in t.name and t.kind == "lora" for t in old)
    assert not any(".experts." in t.name and t.kind == "lora" for t in now)
