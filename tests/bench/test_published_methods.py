"""bench/published.py reads every method memfit models as sources write it (issue 27, cause 7): the PEFT methods of
data/adapters.toml, LitGPT's adapters, precision and --quantize, PEFT modules_to_save ("lora+emb"), unsloth's
offloaded checkpointing given as text; a case it cannot map is skipped naming what memfit does not model.

Each case is a JSON line in the shared schema (cases/README.md), written as a source would, and goes
through read_cases and evaluate like a row of the shared files."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import published  # noqa: E402
from shared_cases import PUBLISHED  # noqa: E402
from shared_support import shared  # noqa: E402

from memfit.facts.catalog import find_model  # noqa: E402
from memfit.facts.frameworks import framework  # noqa: E402

MODEL = "meta-llama/Llama-2-7b-hf"
HIDDEN = find_model(MODEL).hidden_size
# one row of a PEFT + HF Trainer run on one A100, every key of the schema present
BASE = {
    "id": "synthetic-peft-0", "source_type": "issue", "source": "https://example.org/run", "source_detail": None,
    "reliability": "medium", "framework": "PEFT + HF Trainer", "profile": "hf-trainer", "model": MODEL,
    "params_b": 6.74, "method": "lora", "lora_rank": None, "lora_alpha": None, "lora_targets": None,
    "trainable_params": None, "precision": "bf16 (pure)", "quantization": None, "optimizer": "AdamW (torch)",
    "distributed": "single", "zero_stage": None, "offload": None, "num_gpus": 1, "gpu_type": "A100 80GB",
    "gpu_mem_gb": 80, "micro_batch_size": 2, "grad_accum": 1, "seq_len": 512, "seq_len_kind": "fixed/padded",
    "gradient_checkpointing": True, "attention_impl": None, "kernels": None, "compile": False,
    "measured_kind": "torch.cuda.max_memory_allocated", "basis": "allocated", "measured_value": 20.0,
    "measured_unit": "GiB", "value_scope": "per_gpu", "outcome": "fits", "host_ram_value": None,
    "host_ram_unit": None, "host_ram_kind": None, "notes": None,
}
LITGPT = {"framework": "LitGPT 0.5", "profile": "litgpt", "precision": None, "gradient_checkpointing": None}
UNSLOTH = {"framework": "unsloth", "profile": "unsloth", "method": "qlora", "precision": None, "optimizer": None}

# (the case as a source writes it, what the bench's scenario must hold); each expected value differs from what the
# scenario would hold without the mapping (memfit's default, the profile's default, or a skipped row)
MAPPED = {
    "ia3": ({"method": "IA3"}, {"tuning": "ia3"}),
    "ia3 as (IA)^3": ({"method": "(IA)^3"}, {"tuning": "ia3"}),
    "loha with its rank": ({"method": "LoHa", "lora_rank": 16}, {"tuning": "loha", "lora_rank": 16}),
    "lokr, rank in the notes": ({"method": "LoKr", "notes": "LoKrConfig(r=4, alpha=8)"},
                                {"tuning": "lokr", "lora_rank": 4}),
    "vera": ({"method": "VeRA", "lora_rank": 256}, {"tuning": "vera", "lora_rank": 256}),
    "adalora init_r": ({"method": "AdaLoRA", "notes": "init_r=12, target_r=8"}, {"tuning": "adalora", "lora_rank": 12}),
    "oft": ({"method": "OFT"}, {"tuning": "oft"}),
    "boft": ({"method": "BOFT"}, {"tuning": "boft"}),
    "prompt tuning": ({"method": "prompt tuning", "notes": "num_virtual_tokens=30"},
                      {"tuning": "prompt", "virtual_tokens": 30}),
    "prompt tuning from its trainable parameters": ({"method": "Prompt-Tuning", "trainable_params": 24 * HIDDEN},
                                                    {"tuning": "prompt", "virtual_tokens": 24}),
    "p-tuning": ({"method": "p-tuning", "notes": "32 virtual tokens, MLP encoder"},
                 {"tuning": "ptuning", "virtual_tokens": 32}),
    "ln tuning": ({"method": "LN tuning"}, {"tuning": "ln_tuning"}),
    "trainable tokens": ({"method": "trainable tokens", "notes": "token_indices=[0, 1, 2, 32000]"},
                         {"tuning": "trainable_tokens", "trainable_tokens": 4}),
    "lora with trainable token rows": ({"method": "lora", "notes": "trainable_token_indices=[32000, 32001]"},
                                       {"tuning": "lora", "trainable_tokens": 2}),
    "lora+emb": ({"method": "lora+emb", "lora_rank": 16},
                 {"tuning": "lora", "modules_to_save": ("embed_tokens", "lm_head")}),
    "modules_to_save in the notes": ({"method": "lora", "notes": "modules_to_save=['lm_head']"},
                                     {"tuning": "lora", "modules_to_save": ("lm_head",)}),
    "lora over load_in_8bit": ({"method": "lora", "quantization": "bitsandbytes load_in_8bit"},
                               {"tuning": "qlora", "quant_bits": 8}),
    "freeze": ({"method": "freeze", "notes": "freeze_trainable_layers=4"},
               {"tuning": "freeze", "freeze_trainable_layers": 4}),
    "litgpt adapter": ({**LITGPT, "method": "adapter"}, {"tuning": "llama_adapter", "profile": "litgpt"}),
    "litgpt adapter_v2 bf16-true": ({**LITGPT, "method": "adapter_v2", "precision": "bf16-true"},
                                    {"tuning": "llama_adapter_v2", "precision": "bf16-pure"}),
    "litgpt qlora (nf4)": ({**LITGPT, "method": "qlora (nf4)", "quantization": "--quantize bnb.nf4"},
                           {"tuning": "qlora", "quant_bits": 4, "double_quant": False, "precision": "bf16-pure"}),
    "litgpt lora --quantize bnb.nf4-dq": ({**LITGPT, "method": "lora", "quantization": "bnb.nf4-dq",
                                           "precision": "bf16-true"}, {"tuning": "qlora", "double_quant": True}),
    "litgpt full on two devices": ({**LITGPT, "method": "full", "precision": "bf16-true", "distributed": None,
                                    "num_gpus": 2}, {"engine": "fsdp", "precision": "bf16-pure"}),
    "unsloth checkpointing as text": ({**UNSLOTH, "gradient_checkpointing": "unsloth"}, {"checkpointing": "unsloth"}),
    "unsloth offloaded": ({**UNSLOTH, "gradient_checkpointing": "offloaded"}, {"checkpointing": "unsloth"}),
    "unsloth True as text": ({**UNSLOTH, "gradient_checkpointing": "True"}, {"checkpointing": "full"}),
    "unsloth False as text": ({**UNSLOTH, "gradient_checkpointing": "false"}, {"checkpointing": "off"}),
    "use_unsloth_gc under llamafactory": ({"profile": "llamafactory", "framework": "LLaMA-Factory",
                                           "gradient_checkpointing": "unsloth"}, {"checkpointing": "unsloth"}),
    "dpo over ia3": ({"method": "dpo (IA3)"}, {"method": "dpo", "tuning": "ia3"}),
}

# (the case, words its skip reason must hold): what memfit does not model, never a bare "not modeled"
GAPS = {
    "prefix tuning": ({"method": "prefix tuning"}, ("prefix tuning", "PrefixTuningConfig", "past_key_values")),
    "p-tuning v2 is prefix tuning": ({"method": "P-Tuning v2"}, ("prefix tuning",)),
    "litgpt adapter over nf4": ({**LITGPT, "method": "adapter", "quantization": "bnb.nf4", "precision": "bf16-true"},
                                ("llama_adapter over a 4-bit base", "only under LoRA")),
    "litgpt adapter_v2 over nf4": ({**LITGPT, "method": "adapter_v2 (nf4)", "precision": "bf16-true"},
                                   ("llama_adapter_v2 over a 4-bit base",)),
    "litgpt quantize with mixed precision": ({**LITGPT, "method": "lora", "quantization": "bnb.nf4",
                                              "precision": "bf16-mixed"}, ("refuses --quantize",)),
    "litgpt int8-training": ({**LITGPT, "method": "lora", "quantization": "bnb.int8-training",
                              "precision": "16-true"}, ("has_fp16_weights",)),
    "fp4 base": ({"method": "qlora", "quantization": "bnb fp4"}, ("FP4",)),
    "bottleneck adapter outside litgpt": ({"method": "adapter"}, ("bottleneck adapters",)),
    "trainable tokens without a count": ({"method": "trainable_tokens"}, ("--trainable-tokens N",)),
    "a method memfit has no tuning for": ({"method": "BitFit"}, ("no --tuning", "llama_adapter_v2")),
    "selective checkpointing": ({**UNSLOTH, "gradient_checkpointing": "selective"}, ("not a checkpointing memfit",)),
}


def _rows(tmp_path, overrides: list[dict]) -> list[published.Row]:
    """The cases as lines of a case file, read and evaluated as bench/published.py does."""
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps({**BASE, "id": f"synthetic-{n}", **o}) + "\n" for n, o in enumerate(overrides)))
    return [published.evaluate(case) for case in published.read_cases(path)]


def test_the_synthetic_rows_are_in_the_shared_schema():
    shared_keys = json.loads(shared(PUBLISHED).read_text().splitlines()[0]).keys()
    assert set(BASE) == set(shared_keys)


@pytest.mark.parametrize("name", sorted(MAPPED))
def test_each_method_maps_onto_memfits_knobs_and_estimates(name, tmp_path):
    overrides, expected = MAPPED[name]
    row, = _rows(tmp_path, [overrides])
    assert row.skip is None, row.skip
    assert row.predicted and row.predicted > 0 and row.predicted_label in ("fits", "oom", "host_oom")
    scenario = published.scenario_for(row.case)
    assert {k: getattr(scenario, k) for k in expected} == expected


@pytest.mark.parametrize("name", sorted(GAPS))
def test_a_case_the_bench_cannot_map_names_the_gap(name, tmp_path):
    overrides, words = GAPS[name]
    row, = _rows(tmp_path, [overrides])
    assert row.skip and all(w in row.skip for w in words), row.skip


def test_litgpt_defaults_come_from_memfits_profile(tmp_path):
    """An unstated precision is the profile's (LitGPT's scripts: bf16-mixed), not one the bench picks."""
    row, = _rows(tmp_path, [{**LITGPT, "method": "adapter"}])
    assert published.scenario_for(row.case).precision == framework("litgpt").defaults["precision"]


def test_lora_adapters_are_lora_not_llama_adapter():
    assert published._tuning("LoRA adapters", "litgpt") == "lora"
    assert published._tuning("LLaMA-Adapter_v2", "litgpt") == "llama_adapter_v2"


def test_gradient_checkpointing_text_is_read_not_refused():
    assert published.normalize({**BASE, "gradient_checkpointing": ' "unsloth" '})["gradient_checkpointing"] == "unsloth"
    assert published.normalize({**BASE, "gradient_checkpointing": "Yes"})["gradient_checkpointing"] is True
    with pytest.raises(published.Skip, match="gradient_checkpointing"):
        published.normalize({**BASE, "gradient_checkpointing": 3.5})


TORCHTUNE = {"framework": "torchtune", "profile": "torchtune", "precision": "bf16 (pure)", "seq_len": None,
             "seq_len_kind": "alpaca_cleaned unpacked, dynamic padding", "basis": "reserved"}


def test_torchtune_alpaca_rows_of_an_early_release_run_at_the_builders_cut(tmp_path):
    """torchtune < 0.3 cut alpaca rows to its builders' max_seq_len default (512); later releases and packed rows
    keep the skip."""
    early, late, packed = _rows(tmp_path, [
        {**TORCHTUNE, "id": "torchtune-lora-tutorial-9"},
        {**TORCHTUNE, "id": "torchtune-readme-2024-09-9"},
        {**TORCHTUNE, "id": "torchtune-lora-tutorial-9", "seq_len_kind": "alpaca packed"}])
    assert early.skip is None and published.scenario_for(early.case).seq_len == published.TORCHTUNE_ALPACA_CUT[2]
    assert late.skip == packed.skip == "sequence length not stated"


def test_shared_torchtune_alpaca_rows_are_compared():
    rows = [published.evaluate(c) for c in published.read_cases(shared(PUBLISHED))]
    alpaca = [r for r in rows if r.case.get("profile") == "torchtune" and not r.case.get("seq_len")
              and "alpaca" in (r.case.get("seq_len_kind") or "")]
    assert len(alpaca) >= 11 and all(r.skip is None and r.measured for r in alpaca)
