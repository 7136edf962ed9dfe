"""memfit trace of a DPO step (OpenRLHF's DPOTrainer) on a tiny Llama, against `estimate_roles`.

The bench (bench/accuracy.py, DPO group) runs the same comparison on real model sizes; here the sizes are
tiny and multiples of 512 bytes, so the numbers are exact where the formulas are.
"""
import pytest

pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[trace])")

from memfit.roles.estimate import estimate
from memfit.facts.catalog import GpuSpec, ModelSpec
from memfit.errors import MemfitError
from memfit.facts.profiles import build_scenario
from memfit.facts.scenario import Hardware
from memfit.trace.run import run_trace

GPU = GpuSpec(id="a100", name="A100", memory_bytes=80 * 2**30, compute_capability=8.0)
LINEARS = {"q_proj": ["q"], "k_proj": ["k"], "v_proj": ["v"], "o_proj": ["o"],
           "gate_proj": ["gate"], "up_proj": ["up"], "down_proj": ["down"]}
h, V = 256, 1024
B, T = 2, 64  # preference pairs per micro-batch: the policy and the reference see 2 * B rows
TINY = ModelSpec(id="tiny-llama", arch="llama", hidden_size=h, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=64, intermediate_size=512, vocab_size=V, linear_names=LINEARS)
COMPARED = ("weights", "gradients", "optimizer_states", "activations", "logits_loss")
TOLERANCE_PCT = 2.0  # the bench's bar for the DPO group (bench/accuracy.py)


def dpo(profile="openrlhf", **knobs):
    base = {"method": "dpo", "engine": "single", "tuning": "full", "precision": "bf16-pure",
            "optimizer": "adamw-foreach", "attention": "sdpa", "micro_batch": B, "seq_len": T, "padding": "padded"}
    return build_scenario(TINY, Hardware(GPU), base | knobs, profile)


def compared_peak(profile) -> int:
    return max(sum(b.get(c) for c in COMPARED) for p, b in profile.phases.items()
               if p in ("forward", "backward", "optimizer_step"))


# without checkpointing: at this toy size the recomputed layer's backward (shared with SFT) is off by ~5-10%,
# which would hide the DPO terms; the bench checks checkpointed DPO rows at real sizes
@pytest.mark.parametrize("knobs", [{}, {"tuning": "lora", "lora_rank": 8, "attention": "eager"}],
                         ids=["full-sdpa", "lora-eager"])
def test_dpo_trace_agrees_with_the_estimate(knobs):
    s = dpo(**knobs)
    traced = run_trace(s)
    est = estimate(s)
    trace_peak, est_peak = compared_peak(traced.profile), compared_peak(est.allocated)
    assert abs(est_peak - trace_peak) / trace_peak * 100 <= TOLERANCE_PCT, (est_peak, trace_peak)
    # the policy's fp32 log-prob logits are what the forward keeps beyond activations, in both
    fp32_logits = 4 * 2 * B * T * V
    assert traced.marks["forward_end"].get("logits_loss") >= fp32_logits
    assert est.roles[0].rows == 2 * B


def test_openrlhf_loads_a_full_bf16_reference_even_with_lora():
    full, lora = run_trace(dpo()), run_trace(dpo(tuning="lora", lora_rank=8))
    sft_knobs = {"engine": "single", "tuning": "full", "precision": "bf16-pure", "micro_batch": B, "seq_len": T}
    sft = run_trace(build_scenario(TINY, Hardware(GPU), sft_knobs, "hf-trainer"))
    weights = sft.marks["step_end"].get("weights")
    assert full.marks["step_end"].get("weights") == 2 * weights  # policy + reference, both bf16
    assert lora.marks["step_end"].get("weights") > 2 * weights  # + the adapters
    assert "separate frozen 16-bit reference" in " ".join(lora.notes)


def test_fake_dpo_trace_matches_a_real_cpu_run():
    s = dpo(tuning="lora", lora_rank=8)
    fake, real = run_trace(s), run_trace(s, fake=False)
    assert fake.profile.to_json() == real.profile.to_json()


def test_what_the_dpo_trace_does_not_run_says_why():
    with pytest.raises(MemfitError, match="profile openrlhf"):
        run_trace(dpo(profile="trl"))  # TRL's fused chunked log-prob head is not traced
    with pytest.raises(MemfitError, match="padding padded"):
        run_trace(dpo(padding="packed"))
