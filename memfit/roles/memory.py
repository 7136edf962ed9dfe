"""Memory of one role of a multi-model run on one GPU: a trained model, a frozen model, a vLLM generator.

`roles.py` decides which roles exist, where they sit and when they run; this module says what each holds.
A trained role is the core estimator's model (states, activations, phases) with the method's own batch
shape and logits handling; a frozen role (reference, reward) holds weights the way its framework places
them plus the transient of one no-grad forward; the generator holds vLLM's memory budget.
Sources: ../shared/reference/knobs.md C.3 (logits), C.4 (rows), E (multi-model), A.2/A.4 (ZeRO-3), H.1.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from functools import cache

from memfit.memory import overheads
from memfit.memory.activations import Activations, activations
from memfit.breakdown import Breakdown, PhaseProfile
from memfit.facts.catalog import HERE, ModelSpec
from memfit.memory.estimate import allocated_profile
from memfit.memory.host import host_profile
from memfit.facts.engines import engine_of
from memfit.facts.methods import logits_facts
from memfit.memory.inventory import ParamTensor, scenario_tensors, tuned_tensors
from memfit.facts.scenario import Scenario
from memfit.memory.states import HostBuffer, ModelStates, frozen_copy, model_states


# ---------------------------------------------------------------------------------------------- inventory
def role_tensors(s: Scenario, value_head: bool) -> list[ParamTensor]:
    """The role's parameters: the tuned inventory; a value-head model (reward model, critic) is the backbone
    without lm_head plus Linear(hidden, 1) (OpenRLHF models/model.py get_llm_for_sequence_regression)."""
    tensors = scenario_tensors(s)
    if not value_head:
        return tensors
    h = s.model.hidden_size
    kept = [t for t in tensors if t.module != "lm_head"]
    return kept + [ParamTensor("value_head.weight", h, 1, "linear", "value_head", h, 1)]


# ---------------------------------------------------------------------------------------------- logits
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
        return nv * (f.get(f"{prefix}_lowp", 0) * b + f.get(f"{prefix}_fp32", 0) * 4)

    return LogitTerms(copies("forward"), copies("saved"), copies("backward"), copies("nograd"), nv * b)


# ---------------------------------------------------------------------------------------------- trained role
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
    logits_kind: str = "fp32_cast"
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

    def nograd_forward(self, rows: int) -> Breakdown:
        """Peak of a no-grad forward of `rows` rows (rollout log-probs / values) on top of the idle states."""
        fs = frozen_scenario(self.scenario, self.scenario.model, rows)
        return frozen_forward(fs, self.logits_kind, self.value_head)


def trained_role(s: Scenario, rows: int, logits_kind: str, value_head: bool = False) -> TrainedRole:
    """Train-step phases of a role: the core estimator's states and activations, its logits replaced by the
    framework's log-prob handling, for `rows` rows of `s.seq_len` tokens (chosen + rejected already counted)."""
    rs = s.with_changes(micro_batch=rows)
    tensors = role_tensors(rs, value_head)
    ms = model_states(rs, tensors)
    act = activations(rs, [t for t in tensors if t.kind == "lora"])
    head_trains = any(t.trainable and t.kind == "lm_head" for t in tensors)
    terms = logit_terms(rs, logits_kind, rs.tokens_per_micro_batch, value_head, head_trains)
    act = replace(act, logits_forward_peak=terms.forward, logits_saved=terms.saved,
                  logits_backward_peak=terms.backward)
    if hasattr(act, "logits_grad"):  # the core estimator's loss-backward split (estimate._backward)
        act = replace(act, logits_grad=terms.grad)
    alloc = allocated_profile(rs, tensors, ms, act)
    host = host_profile(rs, tensors, ms, act)
    return TrainedRole(rs, tensors, ms, act, terms, alloc, host, logits_kind, value_head)


# ---------------------------------------------------------------------------------------------- frozen role
def frozen_scenario(s: Scenario, model: ModelSpec, rows: int) -> Scenario:
    """A frozen model's forward: 16-bit weights (the frameworks load the reference in the policy's dtype and
    DeepSpeed casts it), no adapters, the layer transients of a checkpoint-free no-grad pass."""
    precision = s.precision.replace("mixed", "pure")
    return s.with_changes(model=model, tuning="full", precision=precision, checkpointing="full",
                          micro_batch=rows, autocast=False, kbit_upcast=False, optimizer_in_backward=False)


def frozen_forward(fs: Scenario, logits_kind: str, value_head: bool, gathered: int = 0) -> Breakdown:
    """Peak bytes (beyond resident weights) of one no-grad forward: inside a layer (its input and output hidden
    states, the layer's transients, the shared masks, the sharded params gathered for it) or at the head (last
    hidden + log-prob computation). The fp32-cast kinds cast the logits after the model's forward returned, when
    ZeRO-3 / FSDP has released every gathered param (measured: OpenRLHF DPO reference, bench/engine.py);
    kinds marked inside_head (TRL's fused head) compute them with the head's weight gathered."""
    act = activations(fs, [])
    hidden = act.layer_checkpoint  # one [rows, T, hidden] tensor in the residual dtype
    in_layer = 2 * hidden + act.layer_forward_transient + act.shared_masks
    terms = logit_terms(fs, logits_kind, fs.tokens_per_micro_batch, value_head, False)
    inside_head = logits_facts(logits_kind).get("inside_head", False)
    head_gathered = gathered if inside_head and not value_head else 0
    at_head = hidden + terms.nograd + head_gathered
    if at_head >= in_layer + gathered:
        return Breakdown({"activations": hidden, "logits_loss": terms.nograd, "weights": head_gathered})
    return Breakdown({"activations": in_layer, "weights": gathered})


@dataclass
class FrozenRole:
    """A model that only runs forward: reference or reward."""

    scenario: Scenario
    tensors: list[ParamTensor]
    engine: str  # how it is placed, in words
    resident: int  # weight bytes on each GPU between forwards
    gathered: int  # ZeRO-3 / FSDP parameters gathered while a layer runs (in `forward` when they are at its peak)
    host_per_rank: int  # offloaded parameter partition (pinned)
    forward: Breakdown  # its no-grad forward's transient at the peak, gathered params included
    notes: list[str] = field(default_factory=list)

    @property
    def params(self) -> int:
        return sum(t.total for t in self.tensors)

    def idle(self) -> Breakdown:
        return Breakdown({"weights": self.resident, "runtime_overhead": overheads.cublas_workspace(
            self.scenario.hardware.gpu)})

    def active(self) -> Breakdown:
        b = self.idle()
        for c, n in self.forward.parts.items():
            b = b.plus(c, n)
        return b


def frozen_role(s: Scenario, model: ModelSpec, rows: int, logits_kind: str, value_head: bool, offload: bool,
                shares_policy: bool = False) -> FrozenRole:
    """Weights as the framework places a frozen model (knobs.md E.1/E.2): a DeepSpeed inference engine
    sharded with the policy's ZeRO-3 config (offload_param honoured only there), a full 16-bit replica for
    any other stage or DDP, an FSDP shard under FSDP; no copy at all when it is the policy with adapters off."""
    fs = frozen_scenario(s, model, rows)
    tensors = role_tensors(fs, value_head)
    if shares_policy:
        engine, resident, gathered, host, notes = "the policy with its LoRA adapters disabled (no second copy)", 0, 0, 0, []
    else:
        engine, resident, gathered, host, notes = frozen_copy(fs, tensors, offload)
    return FrozenRole(fs, tensors, engine, resident, gathered, host, frozen_forward(fs, logits_kind, value_head, gathered),
                      notes)


def frozen_host(fr: FrozenRole, gpus_per_node: int) -> PhaseProfile:
    """Host RAM per node of a frozen role's processes: the process baseline, its load copies, pinned offload."""
    model_bytes = fr.params * fr.scenario.compute_bytes
    base = overheads.PROCESS_HOST_BASELINE * gpus_per_node
    steady = Breakdown({"runtime_overhead": base, "weights": HostBuffer("offload", fr.host_per_rank, "weights", pinned=True).resident
                        * gpus_per_node})
    once = engine_of(fr.scenario).frozen_loads_once_per_node(fr.scenario)
    load = steady.plus("weights", model_bytes if once else model_bytes * gpus_per_node)
    return PhaseProfile({"load": load, "forward": steady, "backward": steady, "optimizer_step": steady,
                         "checkpoint_save": steady, "resume": steady})


# ---------------------------------------------------------------------------------------------- generator
@dataclass
class Generator:
    """vLLM engine workers: each GPU of an engine runs one worker process."""

    model: ModelSpec
    tp: int
    utilization: float
    sleep: bool
    capacity: int
    facts: dict

    @property
    def weights(self) -> int:  # bf16 weights per GPU (tensor parallel shards)
        return full_params(self.model) * 2 // self.tp

    @property
    def budget(self) -> int:
        """gpu_memory_utilization x total memory: weights + activations + KV cache of this worker."""
        return int(self.utilization * self.capacity)

    @property
    def kv_cache(self) -> int:
        return self.budget - self.weights - self.facts["activation_reserve_bytes"]

    def kv_bytes_per_token(self) -> int:
        m = self.model
        return 2 * m.num_layers * max(1, m.num_kv_heads // self.tp) * m.head_dim * 2

    def awake(self) -> Breakdown:
        return Breakdown({"weights": self.weights, "engine_buffers": max(0, self.budget - self.weights)})

    def asleep(self) -> Breakdown:
        """Sleep level 1: weights to host, KV cache dropped; CUDA graphs and NCCL remain."""
        return Breakdown({"engine_buffers": self.facts["sleep_residual_bytes"]})

    def weights_only(self) -> Breakdown:
        """Woken with tags=["weights"] for the weight sync (OpenRLHF broadcast_to_vllm): no KV cache yet."""
        return Breakdown({"weights": self.weights, "engine_buffers": self.facts["sleep_residual_bytes"]})

    def host_per_gpu(self) -> int:
        return self.weights if self.sleep else 0


@cache
def full_params(model: ModelSpec) -> int:
    """Every parameter of the model (the inventory is rebuilt on each call; planning asks often)."""
    return sum(t.total for t in tuned_tensors(model, "full"))


