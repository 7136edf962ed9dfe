"""A model that only runs forward (reference, reward): its weights placed the way its framework places them
(memfit/memory/states: per engine) and the transient of one no-grad forward (docs/knobs.md E.1, E.2, A.4)."""
from __future__ import annotations

from dataclasses import dataclass, field

from memfit.breakdown import Breakdown, PhaseProfile
from memfit.errors import MemfitError
from memfit.facts.catalog import ModelSpec
from memfit.facts.engines import engine_of
from memfit.facts.methods import logits_facts
from memfit.facts.scenario import Scenario
from memfit.memory import overheads
from memfit.memory.activations import activations
from memfit.memory.inventory import ParamTensor
from memfit.memory.states import HostBuffer, frozen_copy
from memfit.roles.trained import TrainedRole, logit_terms, role_tensors


def frozen_scenario(s: Scenario, model: ModelSpec, rows: int) -> Scenario:
    """A frozen model's forward: 16-bit weights (the frameworks load the reference in the policy's dtype and
    DeepSpeed casts it), no adapters, the layer transients of a checkpoint-free no-grad pass."""
    precision = s.precision.replace("mixed", "pure")
    return s.with_changes(model=model, tuning="full", precision=precision, checkpointing="full",
                          micro_batch=rows, autocast=False, kbit_upcast=False, optimizer_in_backward=False)


def nograd_forward(tr: TrainedRole, rows: int) -> Breakdown:
    """A trained model's no-grad forward of `rows` rows (rollout log-probs / values), on top of its idle states."""
    if tr.logits_kind is None:
        raise MemfitError(f"the {tr.scenario.method} model has no log-prob kind (data/methods.toml [logits]), so its "
                          f"no-grad forward cannot be sized; give the method a logits row")
    fs = frozen_scenario(tr.scenario, tr.scenario.model, rows)
    return frozen_forward(fs, tr.logits_kind, tr.value_head)


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
    """Weights as the framework places a frozen model (docs/knobs.md E.1, E.2): a DeepSpeed inference engine
    sharded with the policy's ZeRO-3 config (offload_param honoured only there), a full 16-bit replica for
    any other stage or DDP, an FSDP shard under FSDP; no copy at all when it is the policy with adapters off."""
    fs = frozen_scenario(s, model, rows)
    tensors = role_tensors(fs, value_head)
    notes: list[str]
    if shares_policy:
        engine, resident, gathered, host, notes = "the policy with its LoRA adapters disabled (no second copy)", 0, 0, 0, []
    else:
        engine, resident, gathered, host, notes = frozen_copy(fs, tensors, offload)
    return FrozenRole(fs, tensors, engine, resident, gathered, host, frozen_forward(fs, logits_kind, value_head, gathered),
                      notes)


def frozen_host(fr: FrozenRole, gpus_per_node: int) -> PhaseProfile:
    """Host RAM per node of a frozen role's processes: the process baseline, its load copies, pinned offload."""
    model_bytes = fr.params * fr.scenario.compute_bytes
    base = overheads.host_baseline(fr.scenario.hardware.runtime) * gpus_per_node
    steady = Breakdown({"runtime_overhead": base, "weights": HostBuffer("offload", fr.host_per_rank, "weights", pinned=True).resident
                        * gpus_per_node})
    once = engine_of(fr.scenario).frozen_loads_once_per_node(fr.scenario)
    load = steady.plus("weights", model_bytes if once else model_bytes * gpus_per_node)
    return PhaseProfile({"load": load, "forward": steady, "backward": steady, "optimizer_step": steady,
                         "checkpoint_save": steady, "resume": steady})
