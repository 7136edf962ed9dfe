"""A model that trains, as one role of a run: the memory model's phases with the method's own rows and the
framework's log-prob handling (docs/knobs.md C.3 logits, C.4 rows, E multi-model)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from memfit.breakdown import Breakdown, PhaseProfile
from memfit.facts.methods import logits_facts
from memfit.facts.scenario import Scenario
from memfit.memory.activations import Activations, activations
from memfit.memory.host import host_profile
from memfit.memory.inventory import ParamTensor, scenario_tensors
from memfit.memory.phases import allocated_profile
from memfit.memory.states import ModelStates, model_states


def role_tensors(s: Scenario, value_head: bool) -> list[ParamTensor]:
    """The role's parameters: the tuned inventory; a value-head model (reward model, critic) is the backbone
    without lm_head plus Linear(hidden, 1) (OpenRLHF models/model.py get_llm_for_sequence_regression)."""
    tensors = scenario_tensors(s)
    if not value_head:
        return tensors
    h = s.model.hidden_size
    kept = [t for t in tensors if t.module != "lm_head"]
    return kept + [ParamTensor("value_head.weight", h, 1, "linear", "value_head", h, 1)]


@dataclass(frozen=True)
class LogitTerms:
    forward: int  # peak at the log-prob computation of a forward with grad
    saved: int  # kept for backward
    backward: int  # the loss backward's peak
    nograd: int  # peak of a no-grad forward's log-prob computation
    grad: int = 0  # the logits' gradient reaching lm_head (in the logits' dtype), while the head computes its grads


def logit_terms(s: Scenario, kind: str, tokens: int, value_head: bool, head_trains: bool) -> LogitTerms:
    """Bytes of the log-prob (or value) computation over `tokens` rows x positions, per framework (methods.toml)."""
    b = s.compute_bytes
    if value_head:  # one value per token: [B, T, 1] in the compute dtype, an fp32 copy for the loss
        small = tokens * (b + 4)
        return LogitTerms(small, tokens * 4, small, small, tokens * b)
    v, h = s.model.vocab_size, s.model.hidden_size
    f = logits_facts(kind)
    if kind == "trl_fused":
        tile = min(tokens, f["tile_tokens"]) * min(v, f["tile_vocab"]) * b
        per_token = tokens * f["per_token_fp32"] * 4
        grads = tokens * h * (4 + b) + (v * h * (4 + b) if head_trains else 0)
        return LogitTerms(tile + per_token, per_token, tile + per_token + grads, tile + per_token)
    nv = tokens * v

    def copies(prefix: str) -> int:
        return int(nv * (f.get(f"{prefix}_lowp", 0) * b + f.get(f"{prefix}_fp32", 0) * 4))  # counts may be x.5

    return LogitTerms(copies("forward"), copies("saved"), copies("backward"), copies("nograd"), nv * b)


@dataclass
class TrainedRole:
    """A model that trains: the core estimator's phases with this role's rows and logits handling."""

    scenario: Scenario
    tensors: list[ParamTensor]
    states: ModelStates
    act: Activations
    logits: LogitTerms
    allocated: PhaseProfile  # per GPU, torch allocator
    host: PhaseProfile  # per node
    logits_kind: str | None = None  # None: the loss knob's own logits (SFT)
    value_head: bool = False

    @property
    def params(self) -> int:
        return sum(t.total for t in self.tensors if t.kind != "lora")

    @property
    def trainable(self) -> int:
        return sum(t.total for t in self.tensors if t.trainable)

    def idle(self, sleeping: bool) -> Breakdown:
        """What stays on the GPU between its own work. DeepSpeed sleep (OpenRLHF offload_deepspeed_states)
        moves optimizer states, fp32 master, gradient buffers to host and keeps the 16-bit params."""
        steady = self.allocated.phases["checkpoint_save"]
        if not sleeping:
            return steady
        return Breakdown({"weights": steady.get("weights"), "runtime_overhead": steady.get("runtime_overhead")})

    def sleep_host_bytes(self) -> int:
        """Host bytes per rank that DeepSpeed sleep parks there (pinned, offload_states pin_memory=True)."""
        steady = self.allocated.phases["checkpoint_save"]
        return steady.get("optimizer_states") + steady.get("gradients") + steady.get("engine_buffers")


def trained_role(s: Scenario, rows: int, logits_kind: str | None, value_head: bool = False) -> TrainedRole:
    """Train-step phases of a role: the memory model's states and activations for `rows` rows of `s.seq_len`
    tokens (chosen + rejected already counted). With a `logits_kind` the framework computes log-probs its own
    way (data/methods.toml [logits]); without one the loss is the --loss knob's (SFT, pre-training)."""
    rs = s.with_changes(micro_batch=rows)
    tensors = role_tensors(rs, value_head)
    ms = model_states(rs, tensors)
    act = activations(rs, [t for t in tensors if t.kind == "lora"])
    if logits_kind is None:
        terms = LogitTerms(act.logits_forward_peak, act.logits_saved, act.logits_backward_peak,
                           act.logits_forward_peak, act.logits_grad)
    else:
        head_trains = any(t.trainable and t.kind == "lm_head" for t in tensors)
        terms = logit_terms(rs, logits_kind, rs.tokens_per_micro_batch, value_head, head_trains)
        act = replace(act, logits_forward_peak=terms.forward, logits_saved=terms.saved,
                      logits_backward_peak=terms.backward, logits_grad=terms.grad)
    alloc = allocated_profile(rs, tensors, ms, act)
    host = host_profile(rs, tensors, ms, act)
    return TrainedRole(rs, tensors, ms, act, terms, alloc, host, logits_kind, value_head)
