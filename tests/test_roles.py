"""Runs with several models (memfit/roles/): right label, right reason, right placement."""
import json

import pytest

from memfit.roles.estimate import estimate
from memfit.interfaces.cli.main import main
from memfit.errors import MemfitError

GLM_DPO = dict(model="THUDM/glm-4-9b-chat", gpu="a100-80gb", gpus=8, profile="openrlhf", method="dpo",
               tuning="full", zero_stage=3, micro_batch=1, seq_len=2048, checkpointing="full")
GLM_VOCAB, T = 151552, 2048


def test_glm4_9b_dpo_eager_is_oom_and_flash_fits(scenario):
    """The GLM-4 report of issue 12 (OpenRLHF train_dpo, max_len 2048, --gradient_checkpointing, no --flash_attn):
    OOM after some steps; flash attention fixes it."""
    assert estimate(scenario(attention="eager", **GLM_DPO)).verdict == "oom"
    assert estimate(scenario(attention="flash", **GLM_DPO)).verdict in ("fits", "tight")


def test_glm4_9b_dpo_eager_oom_comes_from_every_layers_scores_kept_without_checkpointing(scenario):
    """GLM-4's own modeling_chatglm.py makes gradient_checkpointing_enable a no-op (data/remote_code.toml
    [chatglm.checkpointing]): OpenRLHF's --gradient_checkpointing leaves all 40 layers' attention scores saved."""
    eager = estimate(scenario(attention="eager", **GLM_DPO))
    assert eager.scenario.checkpointing == "off"
    assert any("never turns checkpointing on" in a for a in eager.scenario.assumed)
    # chosen + rejected: 2 rows x 32 heads x T^2, the fp32 softmax and its 16-bit copy, in each of the 40 layers
    scores = 2 * 32 * T * T * 6 * 40
    assert eager.device_total.peak.get("activations") >= scores
    # LLaMA-Factory sets the layers' flag itself: checkpointing holds there
    lf = estimate(scenario(attention="eager", **{**GLM_DPO, "profile": "llamafactory"}))
    assert lf.scenario.checkpointing == "full"
    assert lf.device_total.peak.get("activations") < scores / 4


def test_glm4_9b_dpo_flash_peak_holds_fp32_logits_of_chosen_and_rejected(scenario):
    flash = estimate(scenario(attention="flash", **GLM_DPO))
    policy = next(r for r in flash.roles if r.role == "policy")
    assert policy.rows == 2  # micro-batch 1 = one chosen + one rejected row
    fp32_logits = 2 * T * GLM_VOCAB * 4
    # the policy's fp32 log-prob logits wait for backward while the reference computes its own
    assert flash.group().peak_moment == "reference_forward"
    assert flash.device_total.peak.get("logits_loss") >= fp32_logits * 2
    ref = next(r for r in flash.roles if r.role == "reference")
    assert ref.process == policy.process  # one process: one CUDA context


def test_reference_placement_follows_the_framework(scenario):
    base = dict(model="qwen2-7b", gpu="a100-80gb", gpus=8, method="dpo", seq_len=1024, micro_batch=2)
    phi_bytes = 2 * 7_615_616_512

    def ref(**knobs):
        e = estimate(scenario(**{**base, **knobs}))
        return next((r for r in e.roles if r.role == "reference"), None), e

    z3, _ = ref(profile="openrlhf", zero_stage=3)
    assert z3.idle.get("weights") == pytest.approx(phi_bytes / 8, rel=0.01)  # sharded like the policy
    z2, _ = ref(profile="openrlhf", zero_stage=2)
    assert z2.idle.get("weights") == pytest.approx(phi_bytes, rel=0.01)  # stage-0 replica on every GPU
    lora_trl, _ = ref(profile="trl", zero_stage=2, tuning="lora")
    assert lora_trl.idle.get("weights") == 0  # adapters disabled: no second copy
    lora_orlhf, _ = ref(profile="openrlhf", zero_stage=2, tuning="lora")
    assert lora_orlhf.idle.get("weights") == pytest.approx(phi_bytes, rel=0.01)  # OpenRLHF loads one anyway
    pre, e = ref(profile="trl", zero_stage=2, precompute_ref_log_probs=True)
    assert pre is None and any("precomputed" in a for a in e.assumptions)
    off3, e3 = ref(profile="openrlhf", zero_stage=3, ref_offload=True)
    assert off3.idle.get("weights") < 10 * 2**20 and e3.host.peak.total > ref(profile="openrlhf", zero_stage=3)[1].host.peak.total
    off2, e2 = ref(profile="openrlhf", zero_stage=2, ref_offload=True)
    assert off2.idle.get("weights") == z2.idle.get("weights")  # offload_param needs ZeRO-3
    assert any("only ZeRO-3" in a for a in e2.assumptions)


@pytest.mark.parametrize("method", ["orpo", "simpo", "rm"])
def test_reference_free_methods_hold_one_model(scenario, method):
    e = estimate(scenario(model="qwen2-7b", gpu="a100-80gb", gpus=8, profile="openrlhf", zero_stage=3,
                                method=method, seq_len=1024))
    assert [r.role for r in e.roles] == ["policy"]
    assert e.roles[0].rows == 2


def test_reward_model_has_a_value_head_instead_of_lm_head(scenario):
    dpo = estimate(scenario(model="qwen2-7b", gpu="a100-80gb", gpus=8, profile="openrlhf", zero_stage=3,
                                  method="dpo", seq_len=1024))
    rm = estimate(scenario(model="qwen2-7b", gpu="a100-80gb", gpus=8, profile="openrlhf", zero_stage=3,
                                 method="rm", seq_len=1024))
    h, v = 3584, 152064
    assert dpo.total_params - rm.total_params == v * h - h
    assert rm.device_total.peak.get("logits_loss") < 2**20


PPO = dict(model="llama-2-7b", gpu="a100-80gb", gpus=8, profile="openrlhf", method="ppo", zero_stage=3,
           micro_batch=4, seq_len=2048, checkpointing="full", colocate="all", vllm_tp=2, rollout_micro_batch=8)


def test_ppo_colocated_on_8_gpus_sums_five_processes_and_flags_the_overflow(scenario):
    e = estimate(scenario(**PPO))
    assert e.verdict == "oom"
    g = e.group()
    assert len(e.groups) == 1 and g.gpus == 8
    assert set(g.by_role()) == {"policy", "critic", "reference", "reward", "generator"}
    assert len(g.processes) == 5  # actor, critic, ref, reward, vLLM worker: each its own CUDA context
    # vLLM's default gpu_memory_utilization 0.95 stays allocated while actor and critic train
    assert g.by_role()["generator"] > 0.9 * g.capacity


def test_ppo_usual_fixes_each_lower_the_peak(scenario):
    peak = lambda **k: estimate(scenario(**{**PPO, **k})).group().peak  # noqa: E731
    base = peak()
    lower = peak(vllm_gpu_memory_utilization=0.5)
    slept = peak(vllm_gpu_memory_utilization=0.5, vllm_sleep=True)
    ds = peak(vllm_gpu_memory_utilization=0.5, vllm_sleep=True, deepspeed_sleep=True)
    off = peak(vllm_gpu_memory_utilization=0.5, vllm_sleep=True, deepspeed_sleep=True, ref_offload=True,
               reward_offload=True)
    assert base > lower > slept > ds > off
    fixed = estimate(scenario(**{**PPO, "vllm_gpu_memory_utilization": 0.5, "vllm_sleep": True,
                                       "deepspeed_sleep": True}))
    assert fixed.verdict == "fits"
    assert fixed.host.peak.total > estimate(scenario(**PPO)).host.peak.total  # slept states live on the host


def test_grpo_has_no_critic_and_colocate_all_checks_engine_count(scenario):
    e = estimate(scenario(**{**PPO, "method": "grpo"}))
    assert "critic" not in {r.role for r in e.roles}
    with pytest.raises(MemfitError, match="vLLM engines x tensor parallel"):
        estimate(scenario(**{**PPO, "vllm_engines": 2}))


def test_sft_scenarios_reject_rl_knobs(scenario):
    with pytest.raises(MemfitError, match="--method"):
        scenario(model="qwen2-7b", ref_offload=True)
    assert scenario(model="qwen2-7b").ref_offload is False


def test_cli_estimate_method_dpo_json(capsys):
    code = main(["estimate", "THUDM/glm-4-9b-chat", "--gpu", "a100-80gb", "--gpus", "8", "--profile", "openrlhf",
                 "--method", "dpo", "--zero", "3", "--micro-batch", "1", "--seq", "8192", "--ckpt", "--attn",
                 "eager", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "oom" and doc["method"] == "dpo"
    assert {r["role"] for r in doc["roles"]} == {"policy", "reference"}
    assert doc["per_rank"]["device_total"]["peak_bytes"] > doc["gpu_memory_bytes"]


def test_cli_ppo_table_prints_per_gpu_sum_by_role(capsys):
    code = main(["estimate", "llama-2-7b", "--gpu", "a100-80gb", "--gpus", "8", "--profile", "openrlhf",
                 "--method", "ppo", "--zero", "3", "--micro-batch", "4", "--seq", "2048", "--ckpt",
                 "--colocate", "all", "--vllm-tp", "2", "--vllm-mem", "0.5"])
    out = capsys.readouterr().out
    assert code == 0 and "OVERFLOWS" in out and "generator" in out and "5 processes per GPU" in out
