"""What DeepSpeed holds on the GPU while it initializes (the load phase), from its code (stage_1_and_2.py,
stage3.py at 0.19.8 and 0.13.1) and the real engine on gloo ranks (bench/engine.py, tests/measure)."""
import pytest

from memfit.facts.catalog import find_gpu, find_model
from memfit.facts.profiles import build_scenario
from memfit.facts.scenario import Hardware
from memfit.memory.inventory import count_params
from memfit.roles.estimate import estimate

GIB = 2**30


def _scenario(model="qwen2-7b-instruct", gpu="a100-80gb", gpus=4, versions=None, **knobs):
    hw = Hardware(gpu=find_gpu(gpu), gpus_per_node=gpus, host_ram=2 * 10**12)
    knobs = {"tuning": "full", "micro_batch": 1, "seq_len": 512, "checkpointing": "full"} | knobs
    return build_scenario(find_model(model), hw, knobs, "hf-trainer", versions=versions)


def _load(s) -> int:
    b = estimate(s).allocated.phases["load"]
    return b.total - b.get("runtime_overhead")


def test_zero3_parameter_offload_copies_nothing_onto_the_gpu_at_load():
    # the case: a 32B model offloaded to the host on one H100 was a phantom 122 GiB OOM at load
    s = _scenario("Qwen/Qwen2.5-32B-Instruct", gpu="h100-sxm", gpus=1, zero_stage=3, offload_optimizer="cpu",
                  offload_param="cpu")
    e = estimate(s)
    assert e.device_total.peak_phase != "load"
    assert e.allocated.phases["load"].get("engine_buffers") < 2 * GIB  # the IPG bucket, no partition copy
    assert e.verdict != "oom"


def test_zero3_without_parameter_offload_defragments_the_partitions_on_the_gpu():
    s = _scenario(zero_stage=3, offload_optimizer="cpu")
    phi = count_params(s.model)
    load = estimate(s).allocated.phases["load"]
    # the copy into lp_param_buffer sits beside the partitions it was made from
    assert load.get("engine_buffers") >= 2 * -(-phi // 4)


def test_zero2_load_is_the_flatten_or_master_plus_a_zero_grad_partition_never_both():
    s = _scenario(zero_stage=2)
    phi = count_params(s.model)
    part = -(-phi // 4)
    # bf16 weights 2 phi, then max(2 phi flatten copy, 4 part master + 4 part zero grads): measured exactly on the
    # real engine (bench/engine.py z1 / z2 rows)
    assert _load(s) == pytest.approx(2 * phi + max(2 * phi, 8 * part), rel=1e-3)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_adam_states_are_lazy_from_deepspeed_0_13_2_and_made_at_init_before(stage):
    lazy = _scenario(zero_stage=stage)
    eager = _scenario(zero_stage=stage, versions={"deepspeed": "0.13.1"})
    part = -(-count_params(lazy.model) // 4)
    assert eager.optimizer_init_step and not lazy.optimizer_init_step
    # DeepSpeed <= 0.13.1 stepped once on zero grads inside initialize_optimizer_states (PR #5104 removed it)
    assert _load(eager) - _load(lazy) >= 8 * part - 8 * part // 100
    assert estimate(eager).allocated.phases["load"].get("optimizer_states") == pytest.approx(12 * part, rel=1e-3)
    # the steps after the first hold the same states in either release
    assert estimate(eager).allocated.phases["optimizer_step"].total == estimate(lazy).allocated.phases[
        "optimizer_step"].total


def test_zero0_makes_adam_states_at_init_in_every_release():
    s = _scenario(zero_stage=0, gpus=2)
    phi = count_params(s.model)
    # FP16_Optimizer's dummy step on zero fp32 grads: 2 + 4 + 8 + 4 bytes per param (measured 18 x phi)
    assert _load(s) == pytest.approx(18 * phi, rel=1e-3)
