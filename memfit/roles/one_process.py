"""One training process per GPU: SFT and pre-training (the trained model alone), and DPO and its relatives and
reward models (the policy and its reference in the same process).

The policy runs its forward first, then the reference's no-grad forward while the policy's saved activations
and log-prob logits are alive (OpenRLHF dpo_trainer.py, TRL dpo_trainer.py _compute_loss, LLaMA-Factory).
"""
from __future__ import annotations

from memfit.breakdown import PHASES, Breakdown, PhaseProfile
from memfit.errors import MemfitError
from memfit.facts.engines import engine_of
from memfit.facts.methods import method_facts, reference, run_methods, several_models
from memfit.facts.scenario import Scenario
from memfit.memory import overheads
from memfit.memory.activations import attention_per_token
from memfit.memory.eager_attention import attention_backward_per_key
from memfit.memory.phases import reserved_profile
from memfit.roles.frozen import FrozenRole, frozen_host, frozen_role
from memfit.roles.groups import (GpuGroup, Holding, Moment, Process, add_parts, frozen_cache, gpu_group, phase_moments,
                                 trained_holding)
from memfit.roles.result import Placement, RoleEstimate
from memfit.roles.trained import TrainedRole, trained_role

REFERENCE_FORWARD = Moment("reference_forward", "forward")


def place(s: Scenario, notes: list[str]) -> Placement:
    facts = method_facts(s.method)
    rows = s.micro_batch * facts.get("rows_per_example", 1)
    value_head = bool(facts.get("value_head"))
    kind = run_methods(s)["logits"] if several_models(s.method) else None
    policy = trained_role(s, rows, kind, value_head)
    reserved = reserved_profile(policy.allocated, policy.states, policy.scenario.hardware.runtime,
                                policy.scenario.tuning)
    ref_kind, why = reference(s)
    notes.extend(why)
    ref = None
    if ref_kind != "none":
        from memfit.facts.catalog import find_model

        if kind is None:
            raise MemfitError(f"method {s.method} has a reference model but runs a single model (data/methods.toml "
                              f"[method.{s.method}] several); a reference needs a log-prob kind")

        ref_model = find_model(s.ref_model) if s.ref_model else s.model
        ref = frozen_role(s, ref_model, rows, kind, False, s.ref_offload, shares_policy=ref_kind == "shared")
        notes.extend(ref.notes)
    if facts.get("kl_rows"):
        notes.append("KTO's mismatched KL rows run as separate no-grad forwards of the same size (not on top)")
    hw = s.hardware
    processes = {"trainer": Process("trainer", s.world_size, hw.runtime, hw.nodes)}
    group = gpu_group(f"all {s.world_size} GPUs", s.world_size, hw.gpu.memory_bytes,
                      _moments(policy, reserved, ref), processes)
    roles = [_policy_role(s, policy, group, rows, kind, value_head)]
    host = policy.host
    if ref:
        ref_host = frozen_host(ref, hw.gpus_per_node)
        extra = {p: b.plus("runtime_overhead", -ref_host.phases[p].get("runtime_overhead"))
                 for p, b in ref_host.phases.items()}  # same process: no second baseline
        host = PhaseProfile({p: add_parts(host.phases[p], extra[p]) for p in PHASES})
        roles.append(RoleEstimate(
            role="reference", model=ref.scenario.model.id, process="trainer", group=group.name, gpus=s.world_size,
            trains=False, engine=ref.engine, params=ref.params if ref_kind == "separate" else 0, trainable=0,
            rows=ref.scenario.micro_batch, seq_len=s.seq_len, idle=Breakdown({"weights": ref.resident}),
            active=ref.active(), host_per_node=max(b.total for b in extra.values()), notes=ref.notes))
    return Placement(roles, [group], host, policy.params, policy.trainable, _drivers(policy, ref, group),
                     s.world_size, policy.states.notes)


def _moments(policy: TrainedRole, reserved: PhaseProfile, ref: FrozenRole | None) -> dict[Moment, list[Holding]]:
    """The policy's phase peaks (the reference's weights resident beside them), and, with a reference, its
    forward on top of what the policy's forward keeps for backward."""
    moments = {moment: [trained_holding("trainer", "policy", policy, phase, reserved)]
               for phase, moment in phase_moments().items()}
    if ref is not None:
        ref_idle = Breakdown({"weights": ref.resident})
        for holdings in moments.values():
            holdings.append(Holding("trainer", "reference", ref_idle))
        # the policy's forward is over: its saved activations and log-prob logits wait for backward
        fwd = policy.allocated.phases["forward"].parts
        kept = Breakdown({**fwd, "activations": policy.act.saved_total, "logits_loss": policy.logits.saved})
        ref_cache = frozen_cache(ref.forward, policy.scenario.hardware.runtime)
        # the caching allocator keeps what the policy's forward reserved: the reference's forward allocates
        # into that slack before it reserves more, so this moment never reserves less than the forward did
        slack = reserved.phases["forward"].total - kept.total - ref.forward.total - ref_cache
        moments[REFERENCE_FORWARD] = [
            Holding("trainer", "policy", kept, max(_policy_cache(policy, kept), slack), policy.states.paged_optimizer),
            Holding("trainer", "reference", add_parts(ref_idle, ref.forward), ref_cache)]
    return moments


def _policy_role(s: Scenario, policy: TrainedRole, group: GpuGroup, rows: int, kind: str | None,
                 value_head: bool) -> RoleEstimate:
    if kind is None:
        note = f"{rows} rows per micro-batch, loss {s.loss}"
    else:
        note = (f"{rows} rows per micro-batch ({rows // s.micro_batch} per example), log-probs: {kind}"
                + (", value head instead of lm_head" if value_head else ""))
    return RoleEstimate(role="policy", model=s.model.id, process="trainer", group=group.name, gpus=s.world_size,
                        trains=True, engine=engine_of(s).describe(s), params=policy.params,
                        trainable=policy.trainable, rows=rows, seq_len=s.seq_len,
                        idle=policy.allocated.phases["checkpoint_save"], active=policy.allocated.peak,
                        host_per_node=policy.host.peak.total, notes=[note])


def _policy_cache(policy: TrainedRole, b: Breakdown) -> int:
    ms = policy.states
    return overheads.allocator_cache(b.get("activations") + b.get("logits_loss") + ms.gathered_forward,
                                     policy.scenario.hardware.runtime, policy.scenario.tuning)


def _drivers(policy: TrainedRole, ref: FrozenRole | None, group: GpuGroup) -> dict[str, int]:
    """Named bytes behind the peak, each from the same formulas the estimate used."""
    ps = policy.scenario
    rows, t = ps.micro_batch, ps.seq_len
    out: dict[str, int] = {}
    _, per_key_saved, per_key_transient = attention_per_token(ps, ps.compute_bytes)
    if per_key_saved or per_key_transient:
        # the larger of: forward's scores in flight, or the saved scores plus the softmax backward's gradients
        per_key = max(per_key_transient,
                      per_key_saved + attention_backward_per_key(ps, ps.compute_bytes, per_key_saved))
        out[f"eager attention scores of one recomputed layer ({rows} rows x {ps.model.num_heads} heads x "
            f"{t}^2)"] = rows * t * t * per_key
    out[f"policy logits and loss saved for backward ({rows} rows x {t} x vocab {ps.model.vocab_size})"] = \
        policy.logits.saved
    out["policy logits and loss, backward peak"] = policy.logits.backward
    if ref is not None:
        out["reference no-grad forward peak (on top of the policy's saved tensors)"] = ref.forward.total
        out["reference weights per GPU"] = ref.resident
    out["policy checkpoints + saved activations"] = policy.act.saved_total
    peak = group.device_total.peak
    out["model states at the peak (weights + gradients + optimizer)"] = (
        peak.get("weights") + peak.get("gradients") + peak.get("optimizer_states"))
    return out
