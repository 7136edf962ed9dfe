"""memfit/planner/speed.py ranks configurations the way the frameworks' costs order them."""
import pytest

from memfit.roles.estimate import estimate
from memfit.planner.speed import assumptions
from memfit.planner.step_time import step_time

LLAMA_A100 = dict(model="meta-llama/Llama-3.1-8B-Instruct", gpu="a100-80gb", gpus=8, profile="hf-trainer",
                  tuning="lora", micro_batch=2, seq_len=4096, checkpointing="full")


def tps(s) -> float:
    return step_time(s).tokens_per_second


def fits(s) -> bool:
    return estimate(s).verdict in ("fits", "tight")


def test_flash_ranks_over_sdpa_and_eager_when_all_fit(scenario):
    flash, sdpa, eager = (scenario(**LLAMA_A100, attention=a) for a in ("flash", "sdpa", "eager"))
    assert all(fits(s) for s in (flash, sdpa, eager))
    assert tps(flash) > tps(sdpa) > tps(eager)
    # eager moves the T x T scores through memory: its penalty grows with the sequence
    short = [scenario(**(LLAMA_A100 | {"seq_len": 512}), attention=a) for a in ("flash", "eager")]
    assert tps(short[0]) / tps(short[1]) < tps(flash) / tps(eager)


def test_no_offload_ranks_over_offload_when_both_fit(scenario):
    kw = dict(model="Qwen/Qwen2-7B-Instruct", gpu="a100-80gb", gpus=8, profile="openrlhf", tuning="full",
              zero_stage=3, micro_batch=2, seq_len=2048, checkpointing="full", attention="flash")
    plain, offload = scenario(**kw), scenario(**kw, offload_optimizer="cpu")
    unpinned = scenario(**kw, offload_optimizer="cpu", pin_memory=False)
    assert fits(plain) and fits(offload)
    assert tps(plain) > tps(offload) > tps(unpinned)
    assert "cpu_optimizer" in step_time(offload).breakdown and "cpu_optimizer" not in step_time(plain).breakdown


def test_ratio_keeps_part_of_the_optimizer_on_the_gpu_and_saves_cpu_time(scenario):
    kw = dict(model="Qwen/Qwen2-7B-Instruct", gpu="rtx4090", gpus=4, profile="openrlhf", tuning="full",
              zero_stage=3, offload_optimizer="cpu", micro_batch=4, seq_len=128)
    full = step_time(scenario(**kw, sub_group_size=100_000_000))
    ratio = step_time(scenario(**kw, sub_group_size=100_000_000, ratio=0.5))
    assert ratio.breakdown["cpu_optimizer"] < full.breakdown["cpu_optimizer"]
    assert ratio.tokens_per_second > full.tokens_per_second


def test_lora_is_faster_than_full_and_qlora_pays_for_dequantization(scenario):
    kw = dict(model="meta-llama/Llama-3.1-8B-Instruct", gpu="a100-80gb", gpus=1, profile="hf-trainer",
              micro_batch=4, seq_len=2048, checkpointing="full", attention="flash")
    full, lora, qlora = (scenario(**kw, tuning=t) for t in ("full", "lora", "qlora"))
    assert tps(lora) > tps(full)
    assert tps(lora) > tps(qlora)
    assert "dequant" in step_time(qlora).breakdown
    # a frozen base still runs backward for the input gradients: LoRA saves about a third of the matmuls
    ratio = step_time(lora).breakdown["matmul"] / step_time(full).breakdown["matmul"]
    assert 0.6 < ratio < 0.75


def test_checkpointing_costs_a_recompute(scenario):
    off, full = (scenario(**(LLAMA_A100 | {"checkpointing": c})) for c in ("off", "full"))
    assert step_time(off).breakdown.get("recompute", 0) == 0
    assert tps(off) > tps(full)


def test_zero3_gathers_cost_more_on_pcie_than_nvlink(scenario):
    kw = dict(model="meta-llama/Llama-3.1-8B-Instruct", gpus=8, profile="hf-trainer", tuning="full",
              zero_stage=3, micro_batch=2, seq_len=2048, checkpointing="full", attention="flash")
    pcie, nvlink = scenario(gpu="a100-80gb-pcie", **kw), scenario(gpu="a100-80gb", **kw)
    assert step_time(pcie).breakdown["collectives"] > 5 * step_time(nvlink).breakdown["collectives"]


def test_gradient_accumulation_multiplies_per_micro_batch_work(scenario):
    one = step_time(scenario(**LLAMA_A100, grad_accum=1))
    four = step_time(scenario(**LLAMA_A100, grad_accum=4))
    assert four.tokens_per_step == 4 * one.tokens_per_step
    assert four.breakdown["matmul"] == pytest.approx(4 * one.breakdown["matmul"])
    assert four.tokens_per_second > one.tokens_per_second  # the optimizer step and all-reduce are shared


def test_packing_counts_only_real_tokens(scenario):
    padded = step_time(scenario(**LLAMA_A100, padding="padded", attention="flash"))
    packed = step_time(scenario(**LLAMA_A100, padding="packed", attention="flash"))
    assert padded.tokens_per_step == pytest.approx(packed.tokens_per_step * assumptions()["data"]["padded_fill"],
                                                   rel=1e-3)
    assert packed.tokens_per_second > padded.tokens_per_second


def test_breakdown_sums_to_the_step(scenario):
    st = step_time(scenario(**LLAMA_A100, zero_stage=2))
    assert sum(st.breakdown.values()) == pytest.approx(st.seconds)
    assert st.tokens_per_second == pytest.approx(st.tokens_per_step / st.seconds)


def test_every_catalog_gpu_has_a_rate(scenario):
    from memfit.facts.catalog import gpus

    for g in gpus():
        s = scenario(model="Qwen/Qwen2-0.5B-Instruct", gpu=g.id, gpus=1, profile="hf-trainer", tuning="full",
                     precision="fp32", micro_batch=1, seq_len=512)
        assert step_time(s).tokens_per_second > 0


def test_lora_config_changes_adapter_flops(scenario):
    kw = dict(LLAMA_A100, gpus=1)
    base = scenario(**kw)
    big = base.with_changes(lora_rank=256)
    assert step_time(big).breakdown["matmul"] > step_time(base).breakdown["matmul"]


def test_elementwise_traffic_follows_the_residual_dtype_and_the_adapted_linears(scenario):
    kw = dict(model="mistralai/Mistral-7B-v0.1", gpu="a100-80gb", profile="trl", tuning="qlora", micro_batch=4,
              seq_len=4096, checkpointing="full", attention="flash", lora_targets=("q", "k", "v", "o"))
    upcast, plain = scenario(**kw), scenario(**kw, kbit_upcast=False)
    assert upcast.kbit_upcast  # TRL runs prepare_model_for_kbit_training on one GPU: the residual stream is fp32
    c = assumptions()["compute"]
    m = upcast.model
    per_byte = upcast.tokens_per_micro_batch * m.num_layers * m.hidden_size / (
        upcast.hardware.gpu.memory_bandwidth_gbps * 1e9 * c["bandwidth_efficiency"])

    def counted(key: str) -> float:  # checkpointed: forward twice (once more in recompute), backward once
        return (2 * c["elementwise_forward"][key] + c["elementwise_backward"][key]) * per_byte

    for s, key in ((upcast, "qlora-32"), (plain, "qlora-16")):
        assert step_time(s).breakdown["elementwise"] == pytest.approx(counted(key), rel=1e-9)
    assert tps(upcast) < tps(plain)
    every = scenario(**(kw | {"lora_targets": ("q", "k", "v", "o", "gate", "up", "down")}), kbit_upcast=False)
    assert step_time(every).breakdown["elementwise"] == pytest.approx(counted("qlora-16-all"), rel=1e-9)
    dropout = scenario(**kw, kbit_upcast=False, lora_dropout=0.05)
    assert step_time(dropout).breakdown["elementwise"] == pytest.approx(counted("qlora-16-dropout"), rel=1e-9)
    # torchtune runs its own LoRA, not PEFT's: its layers are charged as the full row
    own = scenario(**(kw | {"profile": "torchtune", "tuning": "lora"}))
    full = scenario(**(kw | {"profile": "torchtune", "tuning": "full"}))
    assert step_time(own).breakdown["elementwise"] == step_time(full).breakdown["elementwise"]


def test_a_card_given_by_its_memory_keeps_the_speed_of_the_gpu_it_is_like(scenario):
    from dataclasses import replace

    from memfit.facts.catalog import find_gpu
    from memfit.facts.gpu_catalog import custom_gpu

    s = scenario(model="mistralai/Mistral-7B-v0.1", gpu="a100-80gb", tuning="lora", micro_batch=4, seq_len=2048)
    card = custom_gpu(60 * 2**30, like=find_gpu("a100-80gb"))
    assert card.id != "a100-80gb" and card.speed_id == "a100-80gb"
    on_card = replace(s, hardware=replace(s.hardware, gpu=card))
    assert step_time(on_card).tokens_per_second == step_time(s).tokens_per_second  # mfu and host link are the A100's
    assert custom_gpu(60 * 2**30).speed_id == "custom-64424509440"  # like nothing: the table's defaults
