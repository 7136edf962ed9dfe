"""The real DeepSpeed ZeRO-3 engine with CPU optimizer offload, 2 gloo ranks on the CPU, a tiny Llama.

Checks the engine's own buffer sizes against the formulas in memfit/measure/FINDINGS.md and that the
device/host split follows DeepSpeed's objects (every tensor of a CPU run is in RAM, so tensor.device
cannot tell them apart).
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from memfit.facts.catalog import ModelSpec, architectures, find_gpu
from memfit.facts.scenario import Hardware, Scenario

N = 2
BUCKET = 50_000  # elements
PERSIST = 1_000  # params with <= this many elements stay whole on every rank


def tiny_llama() -> ModelSpec:
    family = architectures()["llama"]
    return ModelSpec(id="test/llama-tiny", arch="llama", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=16, intermediate_size=128, vocab_size=512, linear_names=family["linear_names"],
                     published_params=None)


def param_numels(spec: ModelSpec) -> list[int]:
    """Every parameter tensor of the HF Llama built from `spec` (untied head, no biases)."""
    h, kv, i, v = spec.hidden_size, spec.num_kv_heads * spec.head_dim, spec.intermediate_size, spec.vocab_size
    layer = [h * h, kv * h, kv * h, h * h, i * h, i * h, h * i, h, h]  # q k v o gate up down, 2 norms
    return [v * h] + layer * spec.num_layers + [h, v * h]


PORT = {}


@pytest.fixture(scope="module")
def measured():
    from unittest import mock

    from memfit.measure import launch, run_measure

    spec = tiny_llama()
    s = Scenario(model=spec, hardware=Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=N), engine="deepspeed",
                 zero_stage=3, offload_optimizer="cpu", pin_memory=True, reduce_bucket_size=BUCKET,
                 param_persistence_threshold=PERSIST,
                 micro_batch=2, seq_len=32)
    PORT["run"] = launch._free_port()  # known, to look for what the run leaves in /dev/shm
    with mock.patch.object(launch, "_free_port", return_value=PORT["run"]):
        return s, run_measure(s, steps=2, timeout=600)


def test_the_run_leaves_no_shared_memory_behind(measured):
    # DeepSpeed's CPU all-reduce maps /dev/shm/deepspeed_allreduce_buffer_*_<addr>_<port>_<rank> and never
    # unlinks it; the launcher removes this run's
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{PORT['run']}_*"))


def test_parameter_count_is_the_architecture(measured):
    s, result = measured
    assert result.params_total == sum(param_numels(s.model)) == result.params_trainable


def test_zero3_offload_buffers_match_the_formulas(measured):
    s, result = measured
    part = sum(math.ceil(n / N) for n in param_numels(s.model))  # Psi/N: each param split in ceil(n/N)
    persistent = sum(n for n in param_numels(s.model) if n <= PERSIST)
    for rank in result.ranks:
        b = {f"{x.name}@{x.side}": x for x in rank.buffers}
        assert b["zero3.fp16_partitioned_groups_flat@device"].storage_bytes == 2 * part
        assert b["zero3.fp32_partitioned_groups_flat@host"].storage_bytes == 4 * part
        assert b["zero3.optimizer.state.exp_avg@host"].storage_bytes == 4 * part
        assert b["zero3.optimizer.state.exp_avg_sq@host"].storage_bytes == 4 * part
        assert b["zero3.fp32_partition.grad@host"].storage_bytes == 4 * part
        assert b["zero3.grad_partitions_flat_buffer@host"].storage_bytes == 2 * part  # bf16 = grad accum dtype
        assert b["zero3.ipg_bucket@device"].storage_bytes == 2 * BUCKET  # one bf16 bucket, even with overlap_comm
        assert b["zero3.persistent_params@device"].storage_bytes == 2 * persistent
        # what DeepSpeed pins: the fp32 grad buffer and the bf16 grad partitions, not master or Adam
        assert b["zero3.fp32_partition.grad@host"].pinned and b["zero3.grad_partitions_flat_buffer@host"].pinned
        assert not b["zero3.fp32_partitioned_groups_flat@host"].pinned
        assert not b["zero3.optimizer.state.exp_avg@host"].pinned
        assert rank.pinned_host_bytes == 6 * part


def test_device_host_split_follows_the_engine_objects(measured):
    s, result = measured
    part = sum(math.ceil(n / N) for n in param_numels(s.model))
    for rank in result.ranks:
        for phase in ("forward", "backward", "optimizer_step"):
            device, host = rank.device.phases[phase], rank.host.phases[phase]
            assert device.get("optimizer_states") == 0  # master + Adam are offloaded ...
            assert host.get("optimizer_states") == 12 * part  # ... all of them, to the host
            assert host.get("gradients") == 6 * part  # bf16 partitions + fp32 grads
            assert device.get("weights") >= 2 * part  # bf16 partitions stay on the device
        assert rank.device.phases["forward"].get("activations") > 0
        assert rank.device.phases["backward"].get("logits_loss") > 0
        assert rank.host.phases["forward"].get("activations") == 0


def test_resume_loads_the_optimizer_partition_into_host_ram(measured):
    s, result = measured
    part = sum(math.ceil(n / N) for n in param_numels(s.model))
    for rank in result.ranks:
        # a fresh engine holds the fp32 master (Adam state is lazy) and the grad buffers; torch.load
        # (no mmap) adds this rank's whole optimizer file: fp32 master, m and v. Adam's state then *is*
        # the loaded m and v (same host device, no copy), so the peak is fresh + file.
        resume = rank.host.phases["resume"]
        assert resume.get("optimizer_states") == 4 * part + 12 * part
        assert resume.get("gradients") == 6 * part
