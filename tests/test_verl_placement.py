"""verl 0.9.1's PPO / GRPO placement (memfit/roles/verl.py), the placement interface's second user: which
processes share the GPU, what verl's offloads move out of which phase, the reference's CPU offload, the
token budgets of use_dynamic_bsz, and the settings it does not model named under "assumed"."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

from memfit.errors import MemfitError
from memfit.facts.placements import placement_for
from memfit.interfaces.cli.main import main
from memfit.roles.estimate import estimate

GIB = 2**30
QWEN = dict(model="Qwen/Qwen2.5-7B", gpu="h100-sxm", gpus=8, profile="verl", method="grpo", engine="fsdp",
            fsdp_strategy="full_shard", vllm_gpu_memory_utilization=0.6, vllm_sleep=True, micro_batch=4,
            rollout_micro_batch=8, seq_len=2048)


@pytest.fixture
def verl_run(scenario):
    def run(**knobs):
        return estimate(scenario(**{**QWEN, **knobs}))

    return run


def _held(e, moment: str, role: str, category: str | None = None) -> int:
    b = e.group().moments[moment][role]
    return b.total if category is None else b.get(category)


def test_verl_has_its_own_placement_row():
    assert placement_for("verl", "grpo").name == "verl"
    assert placement_for("verl", "sft").name == "one_process"  # its SFT trainer: one process per GPU


def test_actor_and_reference_share_one_process_beside_the_vllm_workers(verl_run):
    e = verl_run()
    roles = {r.role: r for r in e.roles}
    assert list(roles) == ["policy", "reference", "generator"]
    assert roles["policy"].process == roles["reference"].process == "WorkerDict"
    assert roles["generator"].process == "vllm"
    assert [g.name for g in e.groups] == ["global_pool (all models colocated)"]
    assert e.group().processes == ("WorkerDict", "vllm")
    # without offload the actor's FSDP shard and optimizer states stay on the GPU while vLLM generates
    assert e.group().peak_moment == "generate" and e.peak_phase == "forward"
    assert _held(e, "generate", "policy", "optimizer_states") > 6 * GIB


def test_offload_empties_the_rollout_but_not_the_update(verl_run):
    off, on = verl_run(), verl_run(param_offload=True, optimizer_offload=True)
    # the rollout: the actor's params and optimizer states are on the host
    assert _held(off, "generate", "policy", "optimizer_states") > 6 * GIB
    assert _held(on, "generate", "policy", "optimizer_states") == 0
    assert _held(on, "generate", "policy", "weights") == 0
    # the update brings everything back (BaseEngineCtx train mode): not a byte less
    for phase in ("forward", "backward", "optimizer_step"):
        m = f"train_policy:{phase}"
        assert _held(on, m, "policy") == _held(off, m, "policy")
    assert _held(on, "train_policy:optimizer_step", "policy", "optimizer_states") > 6 * GIB
    # a log-prob pass (eval mode) brings the params back, the optimizer states stay out
    assert _held(on, "experience:policy", "policy", "weights") > 0
    assert _held(on, "experience:policy", "policy", "optimizer_states") == 0
    assert on.device_total.peak.total < off.device_total.peak.total
    assert on.host.peak.total > off.host.peak.total  # what left the GPU is in host RAM


def test_optimizer_offload_alone_keeps_the_params_on_the_gpu(verl_run):
    e = verl_run(optimizer_offload=True)
    assert _held(e, "generate", "policy", "optimizer_states") == 0
    assert _held(e, "generate", "policy", "weights") > 3 * GIB  # the fp32 shard of 7.6B over 8 GPUs


def test_the_reference_lives_on_the_host_and_gathers_its_units(verl_run):
    e = verl_run(ref_offload=True)
    ref = next(r for r in e.roles if r.role == "reference")
    assert ref.idle.get("weights") == 0
    assert "CPU-offloaded" in ref.engine
    assert ref.host_per_node > 8 * 7.6e9 * 2 / 8  # the bf16 shards of 8 ranks on the node
    # its forward gathers the root unit (embeddings and lm_head of Qwen2.5-7B, untied: 2 x 152064 x 3584 bf16)
    assert _held(e, "experience:reference", "reference", "weights") >= 2 * 152064 * 3584 * 2
    assert any("param_offload does nothing" in a for a in e.assumptions)


def test_lora_runs_the_reference_as_the_actor_and_vllm_keeps_its_weights_on_the_host(verl_run):
    full, lora = verl_run(), verl_run(tuning="lora", lora_rank=16)
    ref = next(r for r in lora.roles if r.role == "reference")
    assert ref.params > 0 and _held(lora, "experience:reference", "reference", "weights") == 0
    gen = {r.role: r for r in full.roles}["generator"], {r.role: r for r in lora.roles}["generator"]
    # sleep level 2 discards the full weights; level 1 (adapters) offloads them to host RAM
    assert "sleep level 2" in gen[0].engine and "sleep level 1" in gen[1].engine
    assert gen[1].host_per_node - gen[0].host_per_node == 8 * (7_615_616_512 * 2)


def test_dynamic_batch_size_turns_micro_batches_into_token_budgets(verl_run):
    e = verl_run(dynamic_bsz=True, ppo_max_token_len=12288, log_prob_max_token_len=24576)
    policy = next(r for r in e.roles if r.role == "policy")
    assert policy.rows == 6  # 12288 tokens of 2048-token rows
    ref = next(r for r in e.roles if r.role == "reference")
    assert ref.rows == 12
    assert any("use_dynamic_bsz" in a for a in e.assumptions)
    assert e.device_total.phases["backward"].total > verl_run().device_total.phases["backward"].total


def test_ppo_adds_the_critic_to_the_same_process_and_updates_it_first(verl_run):
    e = verl_run(method="ppo", critic_optimizer_offload=True)
    critic = next(r for r in e.roles if r.role == "critic")
    assert critic.process == "WorkerDict" and critic.trains
    moments = list(e.group().moments)
    assert moments.index("train_critic:optimizer_step") < moments.index("train_policy:forward")
    assert _held(e, "generate", "critic", "optimizer_states") == 0
    assert _held(e, "train_critic:optimizer_step", "critic", "optimizer_states") > 0


def test_settings_it_does_not_model_are_named_under_assumed(verl_run):
    e = verl_run(entropy_chunking=True, entropy_checkpointing=True, rollout_n=8)
    text = " ".join(e.assumptions)
    for key in ("entropy_from_logits_with_chunking", "entropy_checkpointing", "rollout.n 8",
                "no reward model worker"):
        assert key in text, key


def test_deepspeed_is_not_a_verl_run(scenario):
    with pytest.raises(MemfitError) as err:
        knobs = {k: v for k, v in QWEN.items() if k != "fsdp_strategy"}
        estimate(scenario(**{**knobs, "engine": "deepspeed", "zero_stage": 3}))
    assert "\n" not in str(err.value) and "--fsdp full_shard" in str(err.value)


def test_the_command_line_estimates_a_verl_grpo_run():
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["estimate", "Qwen/Qwen2.5-7B", "--gpu", "h100-sxm", "--gpus", "8", "--profile", "verl",
                     "--method", "grpo", "--fsdp", "full_shard", "--vllm-mem", "0.6", "--vllm-sleep",
                     "--param-offload", "--optimizer-offload", "--micro-batch", "4", "--seq", "2048", "--json"])
    assert code == 0
    doc = json.loads(out.getvalue())
    assert [r["role"] for r in doc["roles"]] == ["policy", "reference", "generator"]
    assert doc["gpu_groups"][0]["peak_moment"] in doc["gpu_groups"][0]["moments"]


def test_the_actor_update_is_verls_own_fsdp_engine(verl_run):
    """The policy's update moments hold what memory/states/verl_fsdp.py says verl's engine holds (measured on 2 gloo
    ranks, bench/verl_workers.py), not memfit's generic FSDP model: the bf16 logits of its in-place cross entropy,
    never an fp32 copy of them."""
    from memfit.memory.states import verl_fsdp
    from memfit.roles.trained import trained_role
    from memfit.roles.placement import role_scenario

    e = verl_run()
    policy = next(r for r in e.roles if r.role == "policy")
    rs = role_scenario(e.scenario.with_changes(engine="fsdp", fsdp_strategy="full_shard"), 8)
    parts = verl_fsdp.actor_update_parts(trained_role(rs, QWEN["micro_batch"], "bf16_inplace_ce").scenario)
    peak = max(parts.values(), key=lambda b: b.total)
    assert policy.active.total - policy.active.get("runtime_overhead") == peak.total
    tokens = QWEN["micro_batch"] * QWEN["seq_len"]
    forward = _held(e, "train_policy:forward", "policy", "logits_loss")
    assert forward == parts["forward"].get("logits_loss") == tokens * 152_064 * 2  # bf16, nothing beside it
