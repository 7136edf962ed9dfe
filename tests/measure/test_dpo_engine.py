"""OpenRLHF's DPO on the real DeepSpeed engine (2 gloo ranks, a tiny Llama), against `estimate_roles`.

The policy engine plus a bf16 reference engine on every rank: a full replica beside ZeRO-2, sharded like the
policy under ZeRO-3. bench/engine.py runs the same rows on a 22M model (bar: 5%); here the model is smaller
and the check is looser, plus what each engine holds.
"""
from __future__ import annotations

import pytest

from memfit.roles.estimate import estimate
from memfit.facts.catalog import ModelSpec, architectures, find_gpu
from memfit.facts.scenario import Hardware, Scenario

N = 2
H, VOCAB = 128, 4096
TOLERANCE_PCT = 5.0


def tiny_llama() -> ModelSpec:
    family = architectures()["llama"]
    return ModelSpec(id="test/llama-dpo", arch="llama", hidden_size=H, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=32, intermediate_size=256, vocab_size=VOCAB, linear_names=family["linear_names"],
                     published_params=None)


def dpo(stage: int) -> Scenario:
    # buckets as bench/engine.py's rows (HF "auto" fills), so model states and DPO terms dominate the peak
    ds = dict(zero_stage=stage, reduce_bucket_size=H * H, prefetch_bucket_size=int(0.9 * H * H),
              param_persistence_threshold=10 * H)
    return Scenario(model=tiny_llama(), hardware=Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=N),
                    method="dpo", profile="openrlhf", engine="deepspeed", **ds, adapter_dtype="bf16",
                    precision="bf16-mixed", optimizer="adamw-fused", micro_batch=2, seq_len=64)


@pytest.fixture(scope="module")
def measured():
    from memfit.measure import run_batch

    scenarios = [dpo(2), dpo(3)]
    return list(zip(scenarios, run_batch(scenarios, steps=2, timeout=600)))


def _device_peak(result) -> int:
    rank = max(result.ranks, key=lambda r: r.device.peak.total)
    return rank.device.peak.total


def _estimate_peak(s: Scenario) -> int:
    est = estimate(s).allocated  # a CPU run cannot see the CUDA-only runtime overhead
    return max(b.total - b.get("runtime_overhead") for b in est.phases.values())


def test_dpo_device_peak_agrees_with_the_estimate(measured):
    for s, result in measured:
        measured_peak, est = _device_peak(result), _estimate_peak(s)
        assert abs(est - measured_peak) / measured_peak * 100 <= TOLERANCE_PCT, (s.zero_stage, est, measured_peak)


def test_reference_is_a_replica_beside_zero2_and_sharded_under_zero3(measured):
    (_, r2), (_, r3) = measured
    params = r2.params_total  # the policy's
    for rank in r2.ranks:
        ref = {b.name: b for b in rank.buffers if b.name.startswith("ref.")}
        assert ref["ref.module.params"].bytes == 2 * params  # bf16, whole, on every rank
    for rank in r3.ranks:
        ref = {b.name: b for b in rank.buffers if b.name.startswith("ref.")}
        assert ref["ref.zero3.param_partitions"].bytes == pytest.approx(2 * params / N, rel=1e-3)  # its 1/N shard
        assert "ref.module.params" not in ref
