"""The user reports memfit was started for (cases/user-reports.jsonl): right label, right reason."""
from memfit.roles.estimate import estimate

QWEN = dict(model="Qwen/Qwen2-7B-Instruct", gpu="rtx4090", gpus=4, profile="openrlhf", zero_stage=3,
            micro_batch=4, seq_len=128, checkpointing="full", attention="flash")


def test_qwen2_7b_full_zero3_on_4x4090_is_oom_because_of_optimizer_states(scenario):
    e = estimate(scenario(tuning="full", **QWEN))
    assert e.verdict == "oom"
    peak = e.device_total.peak
    # ZeRO-3 alone leaves 12 B/param of fp32 master + Adam per GPU: the biggest part of the peak
    assert peak.get("optimizer_states") == max(peak.parts.values())
    assert peak.get("optimizer_states") > e.scenario.hardware.gpu.memory_bytes / 2


def test_qwen2_7b_adam_offload_fits_and_moves_the_optimizer_to_the_host(scenario):
    before = estimate(scenario(tuning="full", **QWEN))
    after = estimate(scenario(tuning="full", offload_optimizer="cpu", **QWEN))
    assert after.verdict in ("fits", "tight")
    assert after.device_total.peak.get("optimizer_states") == 0
    assert after.host.peak.get("optimizer_states") > before.host.peak.get("optimizer_states")


def test_qwen2_7b_lora_fits(scenario):
    e = estimate(scenario(tuning="lora", lora_rank=16, **QWEN))
    assert e.verdict in ("fits", "tight")
    assert e.trainable_params < 0.01 * e.total_params


LLAMA = dict(model="meta-llama/Llama-3.1-8B-Instruct", gpu="rtx4090", gpus=7, profile="llamafactory",
             tuning="lora", lora_rank=8, seq_len=2048, precision="bf16-pure")


def test_llama31_8b_lora_ddp_micro_batch_4_is_oom_from_logits(scenario):
    e = estimate(scenario(micro_batch=4, **LLAMA))
    assert e.verdict == "oom"
    assert e.peak_phase == "backward"
    peak = e.device_total.peak
    # 8192 tokens x 128256 vocab in fp32 loss buffers dwarfs the checkpointed activations
    assert peak.get("logits_loss") > peak.get("activations")


def test_llama31_8b_lora_fits_with_micro_batch_2_or_zero3(scenario):
    assert estimate(scenario(micro_batch=2, **LLAMA)).verdict in ("fits", "tight")
    z3 = estimate(scenario(micro_batch=4, zero_stage=3, **LLAMA))
    assert z3.verdict in ("fits", "tight")
    ddp = estimate(scenario(micro_batch=4, **LLAMA))
    # ZeRO-3 fits by sharding the frozen bf16 base that DDP replicates on every GPU
    assert z3.device_total.peak.get("weights") < ddp.device_total.peak.get("weights") / 3


QWEN72 = dict(model="Qwen/Qwen2.5-72B-Instruct", gpu="a100-80gb", gpus=8, profile="openrlhf", zero_stage=3,
              offload_optimizer="cpu", checkpointing="full", attention="flash", micro_batch=1, seq_len=2048,
              host_ram=1_400_000_000_000)


def test_qwen25_72b_pinned_offload_costs_more_host_ram_than_unpinned(scenario):
    pinned = estimate(scenario(pin_memory=True, **QWEN72))
    unpinned = estimate(scenario(pin_memory=False, **QWEN72))
    assert pinned.host.phases["forward"].total > unpinned.host.phases["forward"].total
    assert pinned.verdict == "host_oom"


def test_qwen25_72b_resume_costs_more_host_ram_than_a_fresh_start(scenario):
    e = estimate(scenario(pin_memory=False, **QWEN72))
    assert e.host.phases["resume"].total > e.host.phases["forward"].total
    assert e.host.peak_phase == "resume"


def test_qwen25_72b_ratio_moves_optimizer_bytes_from_host_to_gpu(scenario):
    base = estimate(scenario(pin_memory=False, sub_group_size=100_000_000, **QWEN72))
    ratio = estimate(scenario(pin_memory=False, sub_group_size=100_000_000, ratio=0.9, **QWEN72))
    gpu_gain = ratio.device_total.phases["optimizer_step"].get("optimizer_states") - \
        base.device_total.phases["optimizer_step"].get("optimizer_states")
    host_loss = base.host.phases["resume"].total - ratio.host.phases["resume"].total
    assert gpu_gain > 0 and host_loss > 0
    assert ratio.verdict != "oom"
