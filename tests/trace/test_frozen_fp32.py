"""Mixed precision over a model built in fp32 (transformers 4.x without torch_dtype, LitGPT bf16-mixed): the frozen
weights stay fp32, and each frozen Linear's matmul saves the 16-bit copy autocast made of its weight (autocast
caches no cast of a weight that needs no gradient). The estimate agrees with the trace of the real model."""
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from memfit.facts.catalog import find_gpu, find_model  # noqa: E402
from memfit.facts.profiles import build_scenario  # noqa: E402
from memfit.facts.scenario import Hardware  # noqa: E402
from memfit.roles.estimate import estimate  # noqa: E402

COMPARED = ("weights", "gradients", "optimizer_states", "activations", "logits_loss")


def _scenario(gpus: int = 1, **knobs):
    model = replace(find_model("meta-llama/Llama-3.2-1B"), num_layers=4)
    given = {"tuning": "lora", "precision": "bf16-mixed", "frozen_fp32": True, "micro_batch": 2, "seq_len": 512}
    return build_scenario(model, Hardware(find_gpu("a100-80gb"), gpus_per_node=gpus), given | knobs, "hf-trainer")


def _peak(profile) -> int:
    return max(sum(b.get(c) for c in COMPARED) for b in profile.phases.values())


@pytest.mark.parametrize("checkpointing", ["off", "full"])
def test_estimate_within_1_percent_of_the_trace(checkpointing):
    from memfit.trace.run import run_trace

    s = _scenario(checkpointing=checkpointing)
    assert s.frozen_fp32_in_module
    est, traced = _peak(estimate(s).allocated), _peak(run_trace(s).profile)
    assert abs(est - traced) / traced <= 0.01, (est, traced)


def test_the_frozen_weights_and_their_saved_copies_are_what_an_fp32_build_adds():
    """Without checkpointing every frozen Linear's 16-bit copy is saved; checkpointing keeps only the tied head's."""
    bf16 = estimate(_scenario(frozen_fp32=False, checkpointing="off")).allocated.peak.get("weights")
    fp32 = estimate(_scenario(checkpointing="off")).allocated.peak.get("weights")
    ckpt = estimate(_scenario(checkpointing="full")).allocated.peak.get("weights")
    assert fp32 > 2 * bf16 and bf16 < ckpt < fp32


def test_an_engine_that_casts_the_module_holds_16_bit_frozen_weights():
    s = _scenario(gpus=2, engine="deepspeed", zero_stage=2)
    assert not s.frozen_fp32_in_module
    assert not _scenario(precision="bf16-pure").frozen_fp32_in_module


def test_transformers_4_defaults_build_in_fp32():
    model = find_model("meta-llama/Llama-3.2-1B")
    old = build_scenario(model, Hardware(find_gpu("a100-80gb")), {"tuning": "lora"}, "hf-trainer",
                         versions={"transformers": "4.44.2"})
    new = build_scenario(model, Hardware(find_gpu("a100-80gb")), {"tuning": "lora"}, "hf-trainer")
    assert old.frozen_fp32_in_module and not new.frozen_fp32_in_module
