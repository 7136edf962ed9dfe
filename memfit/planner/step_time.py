"""Step-time model of runs with several models (memfit/roles/estimate.py), used only to RANK plans.

Built on speed.py's single-model step and its no-grad forward, gather and host-link terms; every rate is
an assumption in data/speed.toml ([roles] and the sections speed.py reads).

- DPO and its relatives (one process): the policy's train step on rows_per_example x micro-batch rows, plus
  per micro-step the reference's no-grad forward on the same rows (ZeRO-3: its parameters gathered again;
  --ref_offload: each rank's partition fetched from the host first).
- PPO / GRPO (OpenRLHF Ray layout), one rollout cycle: vLLM generates `rollout_samples` sequences, every
  model runs a no-grad forward over them (experience), actor and critic train rollout_samples / global
  train batch steps. Generation runs in waves of as many sequences as the KV cache holds
  (gpu_memory_utilization sets it); each decode step reads the worker's weights. vLLM sleep moves the
  weights down and up once a cycle; DeepSpeed sleep the optimizer states and gradients of actor and
  critic. Processes are summed as if they ran one after another (true when all are colocated).
A configuration whose vLLM has no KV cache for one sequence gets 0 tokens/s: it cannot generate.
"""
from __future__ import annotations

import math

from memfit.facts.methods import generator_facts, method_facts
from memfit.roles.generator import Generator, full_params
from memfit.roles.placement import named_model, reward_and_critic
from memfit.facts.engines import Sharding, engine_of
from memfit.facts.scenario import Scenario
from memfit.planner.speed import (GB, StepTime, assumptions, gather_seconds, host_link_bytes_per_second,
                                  nograd_forward_seconds, param_counts, train_step_time)


def _weight_bytes(s: Scenario) -> int:
    return full_params(s.model) * s.compute_bytes


def _sharded_frozen(s: Scenario) -> bool:
    """A frozen model sharded like the policy is gathered again for each forward."""
    return engine_of(s).frozen_sharded(s)


def _frozen_forward(s: Scenario, offloaded: bool) -> float:
    """A frozen model's no-grad forward of one micro-batch, with its ZeRO-3 gather and offload fetch."""
    seconds = nograd_forward_seconds(s)
    if _sharded_frozen(s):
        weights = _weight_bytes(s)
        seconds += gather_seconds(s, weights)
        if offloaded:
            seconds += weights / s.world_size / host_link_bytes_per_second(s)
    return seconds


def _finish(parts: dict[str, float], tokens: int) -> StepTime:
    seconds = sum(parts.values())
    return StepTime(seconds=seconds, tokens_per_second=tokens / seconds if seconds > 0 else 0.0,
                    tokens_per_step=tokens, breakdown={k: v for k, v in parts.items() if v > 0})


def _single_process(s: Scenario, facts: dict) -> StepTime:
    rows = s.micro_batch * facts.get("rows_per_example", 1)
    policy = s.with_changes(method="sft", micro_batch=rows)
    train = train_step_time(policy)
    parts = dict(train.breakdown)
    if facts.get("reference") and not s.precompute_ref_log_probs:
        ref = policy.with_changes(model=named_model(s.ref_model, "ref") if s.ref_model else s.model)
        parts["reference_forward"] = s.grad_accum * _frozen_forward(ref, s.ref_offload)
    return _finish(parts, train.tokens_per_step)


def _generation(s: Scenario, samples: int) -> float | None:
    """Seconds vLLM spends on one rollout of `samples` sequences; None when its KV cache cannot hold one."""
    gen = Generator(s.model, s.vllm_tp, s.vllm_gpu_memory_utilization, s.vllm_sleep,
                    s.hardware.gpu.memory_bytes, generator_facts())
    concurrent = gen.kv_cache // (gen.kv_bytes_per_token() * s.seq_len) if gen.kv_cache > 0 else 0
    if concurrent < 1:
        return None
    engines = s.vllm_engines or max(1, s.world_size // s.vllm_tp)
    per_engine = math.ceil(samples / engines)
    r = assumptions()["roles"]
    steps = math.ceil(per_engine / concurrent) * s.seq_len * r["response_fraction"]
    bandwidth = s.hardware.gpu.memory_bandwidth_gbps * GB * r["decode_bandwidth_efficiency"]
    seconds = steps * gen.weights / bandwidth
    if s.vllm_sleep:  # weights to the host after the rollout, back before the next
        seconds += 2 * gen.weights / host_link_bytes_per_second(s)
    return seconds


def _sleep_seconds(trained: Scenario) -> float:
    """DeepSpeed sleep of one trained model: its optimizer states and gradients down and up once a step."""
    p = param_counts(trained)
    sharded = engine_of(trained).sharding(trained) >= Sharding.OPTIMIZER
    local = p.trainable / (trained.world_size if sharded else 1)
    per_param = assumptions()["roles"]["deepspeed_sleep_bytes_per_param"]
    return 2 * local * per_param / host_link_bytes_per_second(trained)


def _ray(s: Scenario, facts: dict) -> StepTime:
    """One rollout cycle: generate, score (experience), train; tokens/s over the generated sequences."""
    samples = assumptions()["roles"]["rollout_samples"]
    generate = _generation(s, samples) if s.vllm_engines != 0 else 0.0
    if generate is None:
        return StepTime(seconds=math.inf, tokens_per_second=0.0, tokens_per_step=0)
    actor = s.with_changes(method="sft")
    reward_model, critic_model = reward_and_critic(s)
    trained = [actor] + ([actor.with_changes(model=critic_model)] if facts.get("critic") else [])
    train_steps = max(1, samples // (s.micro_batch * s.grad_accum * s.world_size))
    parts = {"generate": generate, "train": train_steps * sum(train_step_time(t).seconds for t in trained)}
    rollout = actor.with_changes(micro_batch=s.rollout_micro_batch or 1)
    passes = math.ceil(samples / s.world_size / rollout.micro_batch)
    frozen = [(rollout, False) for _ in trained]
    if facts.get("reference") and s.init_kl_coef > 0:
        frozen.append((rollout, s.ref_offload))
    if facts.get("reward") and not s.remote_reward:
        frozen.append((rollout.with_changes(model=reward_model), s.reward_offload))
    parts["experience"] = passes * sum(_frozen_forward(x, off) for x, off in frozen)
    if s.deepspeed_sleep and engine_of(s).optimizer_offload(s) == "none":
        parts["deepspeed_sleep"] = sum(_sleep_seconds(t) for t in trained)
    return _finish(parts, samples * s.seq_len)


def step_time(s: Scenario) -> StepTime:
    """One optimizer step of a run (PPO / GRPO: one rollout cycle); SFT is a one-process run of one model."""
    facts = method_facts(s.method)
    return _ray(s, facts) if facts.get("generator") else _single_process(s, facts)
