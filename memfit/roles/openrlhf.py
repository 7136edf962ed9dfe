"""OpenRLHF's PPO / GRPO placement (train_ppo_ray), declared for memfit/roles/placement.py: one Ray process per
role per GPU (actor, critic, reference, reward), vLLM engine workers beside them, placed in GPU groups by the
colocation flags (docs/knobs.md E.2).

One rollout cycle's steps: the vLLM engines start first, then the models load; vLLM generates; every model
scores the rollouts without gradients (experience); actor and critic train (at once, or one after the other
under DeepSpeed sleep: ppo_train reload -> fit -> offload); the actor's weights go to vLLM (weight sync); a
checkpoint is saved and resumed.
"""
from __future__ import annotations

from memfit.errors import MemfitError
from memfit.facts.engines import engine_of
from memfit.facts.methods import generator_facts, method_facts, reference, run_methods
from memfit.facts.scenario import Scenario
from memfit.roles.frozen import frozen_role
from memfit.roles.generator import Generator
from memfit.roles.placement import Declaration, Step, Worker, named_model, reward_and_critic, role_scenario
from memfit.roles.trained import trained_role

TRAIN_PHASES = ("forward", "backward", "optimizer_step")
ROLE_OF = {"actor": "policy", "critic": "critic", "ref": "reference", "reward": "reward", "vllm": "generator"}


def declare(s: Scenario, notes: list[str]) -> Declaration:
    facts = method_facts(s.method)
    ref_kind, why = reference(s)
    notes.extend(why)
    present = ["actor"] + (["ref"] if ref_kind != "none" else []) + (["critic"] if facts.get("critic") else [])
    if facts.get("reward") and not s.remote_reward:
        present.append("reward")
    if facts.get("generator") and s.vllm_engines != 0:
        present.append("vllm")
    groups, sizes = _layout(s, present)
    pools = {_pool_name(g): n for g, n in sizes.items()}
    models = reward_and_critic(s)
    sleep_notes: list[str] = []
    ds_sleep = _deepspeed_sleep(s, sleep_notes)
    workers = [_worker(s, proc, _pool_name(groups[proc]), sizes[groups[proc]], ds_sleep, models, notes)
               for proc in present]
    notes.extend(sleep_notes)
    d = Declaration(s, pools, workers, [])
    d.steps = _steps(d)
    return d


def _pool_name(group: str) -> str:
    return {"all": "all models colocated"}.get(group, group)


def _deepspeed_sleep(s: Scenario, notes: list[str]) -> bool:
    if s.deepspeed_sleep and engine_of(s).optimizer_offload(s) != "none":
        notes.append("DeepSpeed sleep is a no-op with Adam offload (OpenRLHF offload_deepspeed_states)")
        return False
    return s.deepspeed_sleep


# ---------------------------------------------------------------------------------------------- where they sit
def _layout(s: Scenario, present: list[str]) -> tuple[dict[str, str], dict[str, int]]:
    """process -> GPU group, and GPUs per group (OpenRLHF placement groups)."""
    world = s.world_size
    asked = dict(s.role_gpus)
    groups: dict[str, str] = {}
    for proc in present:
        if s.colocate == "all":
            groups[proc] = "all"
        elif proc in ("actor", "ref") and "actor-ref" in s.colocate:
            groups[proc] = "actor+ref"
        elif proc in ("critic", "reward") and "critic-reward" in s.colocate:
            groups[proc] = "critic+reward"
        else:
            groups[proc] = proc
    sizes: dict[str, int] = {}
    for proc, g in groups.items():
        if proc == "vllm":
            engines = s.vllm_engines if s.vllm_engines else max(1, asked.get("actor", world) // s.vllm_tp)
            n = engines * s.vllm_tp
        else:
            n = asked.get(proc, asked.get("actor", world))
        sizes[g] = max(sizes.get(g, 0), n)
    if s.colocate == "all" and "vllm" in groups:
        actor = asked.get("actor", world)
        engines = s.vllm_engines or actor // s.vllm_tp
        if engines * s.vllm_tp != actor:
            raise MemfitError(f"--colocate all needs actor GPUs ({actor}) == vLLM engines x tensor parallel "
                              f"({engines} x {s.vllm_tp}) (OpenRLHF train_ppo_ray.py assertion)")
    return groups, sizes


# ---------------------------------------------------------------------------------------------- what they hold
def _worker(s: Scenario, proc: str, pool: str, gpus: int, ds_sleep: bool, models, notes: list[str]) -> Worker:
    """The worker of process `proc`; `models`: the run's (reward, critic) models."""
    kind, rollout = run_methods(s)["logits"], s.rollout_micro_batch or 1
    role = ROLE_OF[proc]
    if proc == "actor":
        actor = trained_role(role_scenario(s, gpus), s.micro_batch, kind)
        why = ([f"train micro-batch {s.micro_batch}, rollout micro-batch {rollout}, log-probs {kind}"]
               + (["DeepSpeed sleep: optimizer states, fp32 master and grads on host between fits"] if ds_sleep else []))
        return Worker(role, proc, pool, actor, ds_sleep, train_rows=s.micro_batch, score_rows=rollout, notes=why)
    reward_model, critic_model = models
    if proc == "critic":
        critic = trained_role(role_scenario(s, gpus, critic_model), s.micro_batch, kind, value_head=True)
        return Worker(role, proc, pool, critic, ds_sleep, train_rows=s.micro_batch, score_rows=rollout,
                      notes=["value head instead of lm_head"])
    if proc == "ref":
        ref_model = named_model(s.ref_model, "ref") if s.ref_model else s.model
        ref = frozen_role(role_scenario(s, gpus), ref_model, rollout, kind, False, s.ref_offload)
        notes.extend(ref.notes)
        return Worker(role, proc, pool, ref, score_rows=rollout, notes=ref.notes)
    if proc == "reward":
        reward = frozen_role(role_scenario(s, gpus), reward_model, rollout, kind, True, s.reward_offload)
        notes.extend(n for n in reward.notes if n not in notes)
        return Worker(role, proc, pool, reward, score_rows=rollout, notes=reward.notes)
    return _vllm(s, pool, notes)


def _vllm(s: Scenario, pool: str, notes: list[str]) -> Worker:
    gen = Generator(s.model, s.vllm_tp, s.vllm_gpu_memory_utilization, s.vllm_sleep, s.hardware.gpu.memory_bytes,
                    generator_facts())
    if gen.kv_cache <= gen.kv_bytes_per_token() * s.seq_len:
        notes.append(f"vLLM: weights {gen.weights / 2**30:.1f} GiB per GPU leave no KV cache for one "
                     f"{s.seq_len}-token sequence inside gpu_memory_utilization {gen.utilization}")
    engine = f"vLLM tp={gen.tp}, gpu_memory_utilization {gen.utilization}" + (", sleep level 1" if gen.sleep else "")
    return Worker("generator", "vllm", pool, gen, s.vllm_sleep, world=s.vllm_tp, engine=engine,
                  notes=[f"KV cache {max(0, gen.kv_cache) / 2**30:.1f} GiB per GPU"])


# ---------------------------------------------------------------------------------------------- one iteration
def _steps(d: Declaration) -> list[Step]:
    trainers = [w.role for w in d.workers if w.trains]
    has_vllm = d.worker("generator") is not None
    steps = [Step("load", "load", tuple((r, "load") for r in trainers))]
    if has_vllm:
        steps += [Step("load:vllm", "load", (("generator", "awake"),), alone=True),  # engines start first
                  Step("generate", "forward", (("generator", "awake"),))]
    for role in ("policy", "critic", "reference", "reward"):  # experience: each model scores the rollouts
        if d.worker(role):
            steps.append(Step(f"experience:{role}", "forward", ((role, "score"),)))
    sleeping = d.require("policy").sleeps
    for phase in TRAIN_PHASES + ("checkpoint_save", "resume"):
        if sleeping and phase in TRAIN_PHASES:  # ppo_train: reload -> fit -> offload, one model at a time
            steps += [Step(f"train_{r}:{phase}", phase, ((r, phase),)) for r in trainers]
        else:
            name = f"train:{phase}" if phase in TRAIN_PHASES else phase
            steps.append(Step(name, phase, tuple((r, phase) for r in trainers)))
    if has_vllm:
        steps.append(Step("weight_sync", "optimizer_step", (("generator", "weights"),)))
    return steps
