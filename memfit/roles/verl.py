"""verl 0.9.1's PPO / GRPO placement (the PyPI wheel's verl/...), declared for memfit/roles/placement.py.

What the code does, and what memfit takes from it:
- Processes. trainer/main_ppo_v0.py and trainer/ppo/v1/trainer_base.py map actor, rollout, reference and critic
  to one resource pool, "global_pool" ([n_gpus_per_node] x nnodes). single_controller/ray/base.py
  create_colocated_worker_cls fuses every worker class of a pool into one Ray actor (WorkerDict) per GPU, so
  the hybrid engine's actor and reference (workers/engine_workers.py ActorRolloutRefWorker) and the critic
  (TrainingWorker) share one process and one CUDA context per GPU. The rollout is a vLLM server
  (workers/rollout/vllm_rollout/vllm_async_server.py: distributed_executor_backend "mp"), its GPU workers are
  processes of their own on the same GPUs (RolloutMode.HYBRID). A reward model, when enabled, is another vLLM
  server colocated in the pool (experimental/reward_loop/reward_model.py init_colocated); a rule-based reward
  (the default, reward.reward_model.enable false) holds no GPU memory.
- The rollout shares the GPU with training by sleeping (rollout.free_cache_engine, default true): after
  generation trainer_sync.py on_sample_end puts it to sleep, level 2 (weights and KV cache discarded) for full
  weights, level 1 (weights offloaded to host) for LoRA adapters (vllm_async_server.py _resolve_sleep_level).
  The weight sync (engine_workers.py update_weights) resumes the rollout's weights, streams the actor's
  parameters in buckets (checkpoint_engine update_weights_bucket_megabytes, 2048), offloads the actor's params
  again, then resumes the KV cache: gpu_memory_utilization of the card (rollout.gpu_memory_utilization).
- param_offload / optimizer_offload (actor.fsdp_config, critic.fsdp) move FSDP states between phases, never
  during one (workers/engine/base.py BaseEngineCtx._context_switch): an update (train mode) brings params,
  grads and optimizer states back to the GPU and moves them out on exit; a log-prob pass (eval mode) brings
  the params only; init (transformer_impl.py) offloads them first. Grads are freed on leaving train mode
  (EngineTrainModeCtx: optimizer.zero_grad()). So offload empties the GPU for the rollout, not for the update.
- The reference is a forward-only engine (trainer/config/ref/dp_ref.yaml forward_only: true): FSDP1 wraps it
  with CPUOffload(offload_params=True), FSDP2 with CPUOffloadPolicy(pin_memory=True) (transformer_impl.py
  _build_fsdp_module), and ref.fsdp_config.param_offload is forced off. Its shard lives on the host; a forward
  gathers the root unit (embeddings, final norm, lm_head: the decoder layers are the wrapped units,
  utils/fsdp_utils.py get_fsdp_wrap_policy) for the whole forward plus the running layers. With LoRA there is
  no reference copy (trainer_base.py ref_in_actor: the actor with its adapters disabled).
- Micro-batches: actor.ppo_micro_batch_size_per_gpu trains, rollout.log_prob_micro_batch_size_per_gpu scores.
  Under use_dynamic_bsz a micro-batch is a token budget instead (actor.ppo_max_token_len_per_gpu,
  rollout/ref.log_prob_max_token_len_per_gpu, default 16384; critic.ppo_max_token_len_per_gpu 32768):
  memfit takes ceil(budget / seq_len) rows of seq_len tokens, at least one.
- Log-probs: utils/torch_functional.py logprobs_from_logits (flash-attn's triton cross entropy when installed);
  entropy (entropy_coeff, default 0) from the logits, in chunks of 2048 tokens with
  entropy_from_logits_with_chunking. memfit reads the logits as data/frameworks/verl.toml [methods] says.

The actor's update is verl's own FSDP engine (memfit/memory/states/verl_fsdp.py, data/verl_fsdp.toml: every model
built in fp32 and gathered in bf16, FSDP1's root unit kept gathered through the loss, FSDP2's head its own unit, bf16
logits through flash-attn's in-place cross entropy), measured on 2 gloo ranks (bench/verl_workers.py); its load,
save and resume, and the critic's phases, are memfit's FSDP model. The reference counts the root unit gathered.
"""
from __future__ import annotations

from dataclasses import replace

from memfit.breakdown import PhaseProfile
from memfit.errors import MemfitError
from memfit.facts.methods import generator_facts, method_facts, reference, run_methods
from memfit.facts.placements import placement_facts
from memfit.facts.scenario import Scenario
from memfit.memory.states import verl_fsdp
from memfit.roles.frozen import FrozenRole, frozen_forward, frozen_role
from memfit.roles.generator import Generator
from memfit.roles.placement import Declaration, Parking, Step, Worker, reward_and_critic, role_scenario
from memfit.roles.trained import TrainedRole, trained_role

VERSION = "verl 0.9.1"
POOL = "global_pool (all models colocated)"
WORKER = "WorkerDict"  # the fused actor / reference / critic process of each GPU
TRAIN_PHASES = ("forward", "backward", "optimizer_step")


def declare(s: Scenario, notes: list[str]) -> Declaration:
    s = _fsdp(s, notes)
    facts, world = placement_facts("verl"), s.world_size
    kind = run_methods(s)["logits"]
    rows = _rows(s, notes)
    actor = _verl_update(trained_role(role_scenario(s, world), rows["train"], kind), notes)
    workers = [Worker("policy", WORKER, POOL, actor, train_rows=rows["train"], score_rows=rows["score"],
                      parking=_parking(s.param_offload, s.optimizer_offload),
                      sync_bytes=_sync_bytes(actor, facts), notes=_policy_notes(s, rows, kind))]
    ref = _reference(s, rows["score"], kind, notes)
    if ref:
        workers.append(ref)
    reward_model, critic_model = reward_and_critic(s)
    if method_facts(s.method).get("critic"):
        critic = trained_role(role_scenario(s, world, critic_model), rows["critic"], kind, value_head=True)
        workers.append(Worker("critic", WORKER, POOL, critic, train_rows=rows["critic"], score_rows=rows["critic"],
                              parking=_parking(s.critic_param_offload, s.critic_optimizer_offload),
                              notes=["value head instead of lm_head; critic.fsdp offloads as set"]))
    workers.append(_rollout(s, notes))
    if s.reward_model and not s.remote_reward:
        workers.append(_reward_server(s, reward_model, facts, notes))
    else:
        notes.append(f"{VERSION}: no reward model worker (reward.reward_model.enable defaults to false: a rule-based "
                     f"reward function on the CPU); give --reward-model to add one")
    notes.extend(_unmodelled(s))
    d = Declaration(s, {POOL: world}, workers, [])
    d.steps = _steps(d)
    return d


# ---------------------------------------------------------------------------------------------- the run's settings
def _fsdp(s: Scenario, notes: list[str]) -> Scenario:
    """verl trains under FSDP (actor.strategy fsdp / fsdp2): another engine is not a verl run."""
    if s.engine == "deepspeed":
        raise MemfitError("verl trains with FSDP (actor_rollout_ref.actor.strategy fsdp or fsdp2), not DeepSpeed: "
                          "drop --zero / --engine deepspeed, or give --fsdp full_shard")
    if s.engine == "fsdp":
        return s
    notes.append(f"{VERSION} trains with FSDP (actor.strategy fsdp, fsdp_size -1: full shard over the pool); "
                 f"estimated as --fsdp full_shard")
    return s.with_changes(engine="fsdp", fsdp_strategy="full_shard", fsdp_version=s.fsdp_version or 1)


def _budget_rows(budget: int, seq_len: int) -> int:
    return max(1, -(-budget // seq_len))


def _rows(s: Scenario, notes: list[str]) -> dict[str, int]:
    """Rows of seq_len tokens per micro-batch: training, scoring (log-probs), the critic's."""
    if not s.dynamic_bsz:
        score = s.rollout_micro_batch or s.micro_batch
        if not s.rollout_micro_batch:
            notes.append(f"log-prob micro-batch not given (rollout.log_prob_micro_batch_size_per_gpu): taken as the "
                         f"train micro-batch, {s.micro_batch}")
        return {"train": s.micro_batch, "score": score, "critic": s.micro_batch}
    facts = placement_facts("verl")
    train = s.ppo_max_token_len or facts["token_budget"]
    score = s.log_prob_max_token_len or train
    critic = facts["critic_token_budget"]
    rows = {"train": _budget_rows(train, s.seq_len), "score": _budget_rows(score, s.seq_len),
            "critic": _budget_rows(critic, s.seq_len)}
    notes.append(f"use_dynamic_bsz: micro-batches are token budgets (train {train}, log-prob {score}, critic "
                 f"{critic} tokens per GPU), taken as {rows['train']} / {rows['score']} / {rows['critic']} rows of "
                 f"{s.seq_len} tokens (rounded up)")
    return rows


def _policy_notes(s: Scenario, rows: dict[str, int], kind: str) -> list[str]:
    where = [("params", s.param_offload), ("optimizer states", s.optimizer_offload)]
    parked = [name for name, on in where if on]
    return [f"train micro-batch {rows['train']}, log-prob micro-batch {rows['score']}, log-probs {kind}",
            "between phases on the host: " + (", ".join(parked) if parked else "nothing (no offload)")
            + "; every update runs with all its states on the GPU"]


def _parking(params: bool, optimizer: bool) -> Parking:
    """BaseEngineCtx: at rest offloaded states are on the host; eval mode brings the params back."""
    gpu = ("engine_buffers",) + (() if params else ("weights",)) + (() if optimizer else ("optimizer_states",))
    host = (("weights",) if params else ()) + (("optimizer_states",) if optimizer else ())
    score = ("engine_buffers", "weights") + (() if optimizer else ("optimizer_states",))
    return Parking(gpu, host, score)


def _verl_update(actor: TrainedRole, notes: list[str]) -> TrainedRole:
    """The update's phases as verl's own FSDP engine lays them out (memory/states/verl_fsdp.py: fp32 shards gathered
    in bf16, its units, bf16 logits; measured on 2 gloo ranks, bench/verl_workers.py), with the runtime overhead
    of memfit's FSDP model; load, save and resume stay that model's."""
    parts = verl_fsdp.actor_update_parts(actor.scenario, "flash_ce")
    phases = dict(actor.allocated.phases)
    for phase, b in parts.items():
        phases[phase] = b.plus("runtime_overhead", phases[phase].get("runtime_overhead"))
    notes.append(f"{VERSION} actor update by its own FSDP engine (data/verl_fsdp.toml): log-probs by flash-attn's "
                 f"in-place cross entropy (verl's GPU install; without flash-attn 2 B more per logit)")
    return replace(actor, allocated=PhaseProfile(phases))


def _sync_bytes(actor: TrainedRole, facts: dict) -> int:
    """update_weights: one bucket of 16-bit weights on its way to vLLM, and the largest tensor gathered whole from
    its fp32 shards (SHARDED_STATE_DICT, DTensor.full_tensor() one tensor at a time) with its bf16 copy."""
    largest = max(t.total for t in actor.tensors) * (4 + 2)
    return facts["sync_bucket_bytes"] + largest


# ---------------------------------------------------------------------------------------------- the workers
def _reference(s: Scenario, rows: int, kind: str, notes: list[str]) -> Worker | None:
    ref_kind, why = reference(s)
    notes.extend(why)
    if ref_kind == "none":
        return None
    rs = role_scenario(s, s.world_size)
    if ref_kind == "shared":
        ref = frozen_role(rs, s.model, rows, kind, False, False, shares_policy=True)
        return Worker("reference", WORKER, POOL, ref, score_rows=rows,
                      notes=["the actor with its LoRA adapters disabled (trainer_base.py ref_in_actor)"])
    if s.ref_offload:
        notes.append("ref.fsdp_config.param_offload does nothing: the forward-only reference is CPU-offloaded by FSDP "
                     "itself (transformer_impl.py forces _is_offload_param off)")
    return Worker("reference", WORKER, POOL, _offloaded_reference(frozen_role(rs, s.model, rows, kind, False, False)),
                  score_rows=rows, notes=["FSDP CPUOffload: the shard on the host, gathered per unit"])


def _offloaded_reference(fr: FrozenRole) -> FrozenRole:
    """The forward-only engine: no shard resident on the GPU, the root unit gathered beside the running layers."""
    lp = fr.scenario.compute_bytes
    root = sum(t.total for t in fr.tensors if not t.per_layer) * lp  # gathered from the first layer to the head
    forward = frozen_forward(fr.scenario, _kind_of(fr), False, fr.gathered).plus("weights", root)
    return replace(fr, engine="FSDP forward-only engine, params CPU-offloaded (CPUOffload / CPUOffloadPolicy)",
                   resident=0, gathered=fr.gathered + root, host_per_rank=fr.resident, forward=forward)


def _kind_of(fr: FrozenRole) -> str:
    return run_methods(fr.scenario)["logits"]


def _rollout(s: Scenario, notes: list[str]) -> Worker:
    level = 1 if s.uses_adapters else 2
    gen = Generator(s.model, s.vllm_tp, s.vllm_gpu_memory_utilization, s.vllm_sleep, s.hardware.gpu.memory_bytes,
                    generator_facts(), sleep_level=level)
    if gen.kv_cache <= gen.kv_bytes_per_token() * s.seq_len:
        notes.append(f"vLLM: weights {gen.weights / 2**30:.1f} GiB per GPU leave no KV cache for one "
                     f"{s.seq_len}-token sequence inside gpu_memory_utilization {gen.utilization}")
    engine = (f"vLLM tp={gen.tp}, gpu_memory_utilization {gen.utilization}"
              + (f", free_cache_engine (sleep level {level})" if gen.sleep else ", always awake"))
    return Worker("generator", "vllm", POOL, gen, gen.sleep, world=s.vllm_tp, engine=engine,
                  notes=[f"KV cache {max(0, gen.kv_cache) / 2**30:.1f} GiB per GPU"])


def _reward_server(s: Scenario, model, facts: dict, notes: list[str]) -> Worker:
    tp = min(facts["reward_tp"], s.world_size)
    gen = Generator(model, tp, facts["reward_gpu_memory_utilization"], True, s.hardware.gpu.memory_bytes,
                    generator_facts(), sleep_level=1)
    notes.append(f"reward model: a colocated vLLM server at verl's defaults (reward.reward_model.rollout "
                 f"tensor_model_parallel_size {tp}, gpu_memory_utilization {gen.utilization}, sleep level 1); "
                 f"memfit has no knob for those")
    return Worker("reward", "reward vllm", POOL, gen, True, world=tp,
                  engine=f"vLLM server tp={tp}, gpu_memory_utilization {gen.utilization}, sleeps between rewards")


def _unmodelled(s: Scenario) -> list[str]:
    """Settings that change memory in verl that memfit does not model: named, never dropped."""
    out = []
    if s.entropy_chunking:
        out.append("entropy_from_logits_with_chunking: not modelled (entropy over 2048-token chunks, only computed "
                   "when entropy_coeff != 0); the logits' peak is estimated without it")
    if s.entropy_checkpointing:
        out.append("entropy_checkpointing: not modelled (recomputes the entropy in backward); estimated without it")
    if s.rollout_n and s.rollout_n > 1:
        out.append(f"rollout.n {s.rollout_n}: more rollouts per prompt change how many micro-batches run, not their "
                   f"size; the rollouts wait in host memory (TransferQueue), not counted")
    return out


# ---------------------------------------------------------------------------------------------- one iteration
def _steps(d: Declaration) -> list[Step]:
    """trainer_base.py _step_once and trainer_sync.py: generate, sleep the rollout, reward, old log-probs,
    reference log-probs, values, update the critic, update the actor, save, sync the weights to the rollout."""
    has = {w.role for w in d.workers}
    trainers = [r for r in ("critic", "policy") if r in has]  # _update_critic runs before _update_actor
    frozen = (("reference", "rest"),) if "reference" in has else ()
    # the models load before the rollout servers start (trainer_base.py _setup); a server starting up takes its
    # gpu_memory_utilization beside the models at rest: what the generate moment holds, so it is not repeated
    steps = [Step("load", "load", tuple((r, "load") for r in trainers) + frozen, alone=True),
             Step("generate", "forward", (("generator", "awake"),))]
    if "reward" in has:
        steps.append(Step("experience:reward", "forward", (("reward", "awake"),)))
    for role in ("policy", "reference", "critic"):
        if role in has:
            steps.append(Step(f"experience:{role}", "forward", ((role, "score"),)))
    for role in trainers:
        steps += [Step(f"train_{role}:{phase}", phase, ((role, phase),)) for phase in TRAIN_PHASES]
    for phase in ("checkpoint_save", "resume"):
        steps += [Step(f"{phase}:{role}", phase, ((role, phase),)) for role in trainers]
    steps.append(Step("weight_sync", "optimizer_step", (("policy", "sync"), ("generator", "weights"))))
    return steps
