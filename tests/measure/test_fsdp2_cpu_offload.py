"""torch's FSDP2 with CPUOffloadPolicy(pin_memory=True), 2 gloo ranks on the CPU, a tiny Llama: the run a CPU-only
torch could not start (`Tensor.pin_memory` needs an accelerator) until measure marked the shards pinned instead."""
from __future__ import annotations

import math

import pytest

from memfit.facts.catalog import find_gpu
from memfit.facts.scenario import Hardware, Scenario
from memfit.roles.estimate import estimate
from tests.measure.test_zero3_offload import N, param_numels, tiny_llama


@pytest.fixture(scope="module")
def measured():
    from memfit.measure import run_measure

    s = Scenario(model=tiny_llama(), hardware=Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=N), engine="fsdp",
                 fsdp_version=2, fsdp_strategy="full_shard", fsdp_cpu_offload=True, precision="bf16-mixed",
                 attention="sdpa", micro_batch=2, seq_len=32)
    return s, run_measure(s, steps=2, timeout=600)


def test_each_rank_keeps_its_fp32_shards_pinned_on_the_host(measured):
    s, result = measured
    shard = sum(math.ceil(n / N) for n in param_numels(s.model))  # dim-0 shards; every dim here is even
    for rank in result.ranks:
        assert rank.pinned_host_bytes == 4 * shard
        assert rank.device.peak.get("optimizer_states") == 0 and rank.device.peak.get("gradients") == 0


def test_the_device_peak_is_under_the_estimate_and_close_to_it(measured):
    s, result = measured
    device = max(r.device.peak.total for r in result.ranks)
    est = estimate(s).allocated
    predicted = max(b.total - b.get("runtime_overhead") for b in est.phases.values())
    assert device <= predicted <= 1.15 * device, (device, predicted)
