"""`memfit trace`: real training steps of the real transformers/PEFT code, on fake tensors, on the CPU.

    from memfit.trace import run_trace
    result = run_trace(scenario)          # 2 steps; result.profile is the steady-state (last) step

Each step is what HF Trainer's training_step does: forward with the model's own loss (labels =
input_ids), keep only the loss (the output with its bf16 logits is dropped before backward, as
`compute_loss` returns the loss alone), backward, `clip_grad_norm_(1.0)`, optimizer step,
`zero_grad(set_to_none=True)`. The `Accountant` labels every storage (weights, gradients, optimizer
states, activations, logits/loss) and records the peak of each phase; `cuda.py` makes kernels and
autocast behave as on a CUDA GPU. Fake tensors hold no memory, so an 8B model traces in seconds.
"""
from __future__ import annotations

import time
import warnings
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace

import torch

from memfit.breakdown import CATEGORIES, Breakdown, PhaseProfile
from memfit.errors import MemfitError
from memfit.facts.methods import several_models
from memfit.facts.scenario import Scenario
from memfit.trace.accountant import Accountant, TimelinePoint
from memfit.trace.build import BuiltModel, build_model
from memfit.trace.cuda import CudaTarget
from memfit.trace.offload import HostTransfer
from memfit.trace.training_step import _install_hooks, label_model_state, traced_step

MAX_GRAD_NORM = 1.0  # HF TrainingArguments.max_grad_norm default
LR = 1e-5


@dataclass
class TraceResult:
    profile: PhaseProfile  # per-phase peak breakdowns of the last (steady-state) step
    timeline: list[TimelinePoint]  # every allocation of every step
    seconds: float
    steps: int
    marks: dict[str, Breakdown] = field(default_factory=dict)  # forward_end / backward_end / step_end, last step
    kernels: dict[str, int] = field(default_factory=dict)  # attention kernels chosen (last step)
    notes: list[str] = field(default_factory=list)  # how the CPU run emulates CUDA, model substitutions
    extras: dict[str, int] = field(default_factory=dict)  # named numbers (optimizer temporaries, ...)
    scenario: dict = field(default_factory=dict)

    @property
    def peak(self) -> Breakdown:
        return self.profile.peak

    def step_timeline(self, step: int | None = None) -> list[TimelinePoint]:
        step = self.steps - 1 if step is None else step
        return [p for p in self.timeline if p.step == step]

    def to_json(self, timeline: bool = True) -> dict:
        out = {
            "scenario": self.scenario,
            "seconds": round(self.seconds, 3),
            "steps": self.steps,
            "profile": self.profile.to_json(),
            "marks": {name: b.to_json() for name, b in self.marks.items()},
            "kernels": self.kernels,
            "extras": self.extras,
            "notes": self.notes,
        }
        if timeline:
            out["timeline_categories"] = list(CATEGORIES)
            out["timeline"] = [[p.tick, p.step, p.phase, *p.parts] for p in self.timeline]
        return out


# ---------------------------------------------------------------------------------------------- optimizer
def make_optimizer(scenario: Scenario, params):
    name = scenario.optimizer
    if name == "adamw-foreach":
        return torch.optim.AdamW(params, lr=LR, weight_decay=0.0, foreach=True)
    if name == "adamw-fused":
        return torch.optim.AdamW(params, lr=LR, weight_decay=0.0, fused=True)
    if name == "adamw-loop":
        return torch.optim.AdamW(params, lr=LR, weight_decay=0.0, foreach=False)
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR, momentum=0.9, foreach=True)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=LR, foreach=False)
    raise MemfitError(f"trace cannot run optimizer {name!r} (bitsandbytes kernels need a GPU); "
                      f"trace with adamw-foreach/adamw-fused/adamw-loop/sgd/adafactor instead")


# ---------------------------------------------------------------------------------------------- inputs
@dataclass
class Batch:
    kwargs: dict
    real_tokens: int | None  # flash unpadding: tokens that are not padding (None = no padding)
    indices: torch.Tensor | None  # real runs: flattened positions of the real tokens


def padding_plan(scenario: Scenario, pad_tokens: int) -> tuple[int, int, int]:
    """(rows, row length, padded positions) of the micro-batch tensor."""
    rows, length = scenario.micro_batch, scenario.seq_len
    if scenario.padding == "padding_free":
        return 1, rows * length, 0
    if scenario.padding == "packed":
        return rows, length, 0
    return rows, length, max(0, min(pad_tokens, length - 1))


def make_batch(scenario: Scenario, pad_tokens: int, fake: bool, acc: Accountant | None = None) -> Batch:
    """A collator's batch: input_ids, labels (a separate tensor, like HF collators), maybe a padding mask."""
    rows, length, pads = padding_plan(scenario, pad_tokens)
    vocab = scenario.model.vocab_size
    ids = torch.randint(0, vocab, (rows, length))
    kwargs = {"input_ids": ids, "labels": ids.clone()}
    real_tokens = indices = None
    if pads:
        mask = torch.ones((rows, length), dtype=torch.long)
        mask[-1, length - pads:] = 0  # right padding of the last row, as HF collators pad for training
        kwargs["attention_mask"] = mask
        real_tokens = rows * length - pads
        if not fake and scenario.attention == "flash":
            with acc.paused() if acc is not None else nullcontext():  # data for the flash stand-in, not a CUDA tensor
                indices = torch.nonzero(mask.flatten()).flatten()
    if scenario.padding == "padding_free":
        kwargs["position_ids"] = torch.arange(scenario.seq_len).repeat(scenario.micro_batch)[None]
    return Batch(kwargs, real_tokens, indices)


# ---------------------------------------------------------------------------------------------- labelling
def _label_state(acc: Accountant, built: BuiltModel, optimizer, reference: BuiltModel | None = None) -> None:
    """At a step boundary, `built`'s state (label_model_state); a frozen `reference`'s parameters and buffers are
    weights too (again at the step's end: a no-op, they stay weights)."""
    label_model_state(acc, built.model, [optimizer])
    if reference is not None:
        for t in (*reference.model.parameters(), *reference.model.buffers()):
            acc.register(t, "weights")


def _host_transfer(acc: Accountant) -> HostTransfer:
    """Offloaded activations: a host-labelled copy going out, a counted device copy coming back."""

    def to_host(t):
        h = torch.empty(t.size(), dtype=t.dtype)
        acc.host(h)
        return h.copy_(t)

    return HostTransfer(to_host, lambda h, device: h.clone())


# ---------------------------------------------------------------------------------------------- the trace
def _check_supported(scenario: Scenario) -> None:
    if scenario.releases:  # the trace runs the installed code; the estimate would model other releases
        raise MemfitError("trace runs the installed (pinned) framework releases; drop --framework-version")
    if several_models(scenario.method):
        from memfit.trace.dpo import check_supported

        check_supported(scenario)
    elif scenario.loss != "standard":
        raise MemfitError(f"trace runs the model's own loss; loss {scenario.loss!r} is not traced yet")
    if scenario.model.encoder_decoder:
        raise MemfitError("trace runs decoder-only models")


def run_trace(scenario: Scenario, steps: int = 2, *, fake: bool = True, pad_tokens: int = 1,
              num_layers: int | None = None, target: CudaTarget | None = None, inspect=None,
              events: list | None = None) -> TraceResult:
    """Run `steps` training steps of `scenario` and account every tensor.

    fake=False runs for real on the CPU (small models only; same accountant, for checking the fake run).
    pad_tokens: padding positions in a "padded" batch (at the end of the last row); they put a mask in
      the batch (SDPA -> mask path, flash -> unpad path) while keeping the token count at its maximum.
    num_layers: override the decoder layer count (for per-layer measurements).
    inspect: optional callback(mark, accountant) at forward_end/backward_end/step_end of every step;
      with it the accountant records each storage's origin (op, shape, dtype) for `accountant.live()`.
    events: optional list the accountant appends every allocation and free to (memfit.trace.allocator).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from transformers.utils import logging as hf_logging

    _check_supported(scenario)
    if num_layers is not None:
        scenario = replace(scenario, model=replace(scenario.model, num_layers=num_layers))
    target = target or CudaTarget.for_gpu(scenario.hardware.gpu)
    started = time.perf_counter()
    acc = Accountant(debug=inspect is not None)
    acc.inspect = inspect
    acc.events = events
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None
    built = build_model(scenario, device="cpu", fake_mode=fake_mode, host_transfer=_host_transfer(acc))
    reference = _preference_models(scenario, built, fake_mode)
    optimizer = make_optimizer(scenario, built.trainable)
    handles = _install_hooks(acc, built, reference)
    kernels = {}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the trace reports its own notes
    try:
        with ExitStack() as stack:
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore", FutureWarning)  # transformers v5 deprecation notices reached via PEFT
            if fake_mode is not None:
                stack.enter_context(fake_mode)
            stack.enter_context(acc)
            for step in range(steps):
                kernels = _train_step(acc, built, optimizer, scenario, step, pad_tokens, fake, target, reference)
    finally:
        hf_logging.set_verbosity(verbosity)
        for h in handles:
            h.remove()
    seconds = time.perf_counter() - started
    last = steps - 1
    profile = acc.profile(last)
    marks = {name.split("@")[0]: b for name, b in acc.marks.items() if name.endswith(f"@{last}")}
    result = TraceResult(profile, acc.timeline, seconds, steps, marks, kernels,
                         _notes(scenario, built, fake, target, pad_tokens, reference), {}, _summary(scenario))
    result.extras = _extras(result)
    return result


@contextmanager
def batch_facts(scenario: Scenario):
    """Answer transformers' data-dependent mask questions with what the batch is known to be.

    On fake tensors `masking_utils.find_packed_sequence_indices` cannot read the position ids and
    assumes packed sequences, which would build a B x 1 x T x T mask a real run never builds. Only a
    padding-free batch restarts its positions.
    """
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    if scenario.padding != "padding_free":
        masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def _batch_and_loss(acc, built, reference, scenario, pad_tokens, fake):
    """What makes the micro-batch and the forward that turns it into the loss: HF's (SFT) or OpenRLHF's DPO step."""
    if not several_models(scenario.method):
        # HF compute_loss returns the loss only: the output with its logits dies with this call
        return lambda: make_batch(scenario, pad_tokens, fake, acc), lambda batch: built.model(**batch.kwargs).loss
    from memfit.trace import dpo

    return (lambda: dpo.preference_batch(scenario, pad_tokens, fake, acc),
            lambda batch: dpo.forward_loss(acc, built, reference, batch, scenario))


def _preference_models(scenario: Scenario, built: BuiltModel, fake_mode) -> BuiltModel | None:
    """DPO / IPO: OpenRLHF's changes to the policy, and its separate reference model (None for SFT)."""
    if not several_models(scenario.method):
        return None
    from memfit.trace.dpo import build_reference, prepare_policy

    prepare_policy(built)
    return build_reference(scenario, fake_mode)


def _train_step(acc, built, optimizer, scenario, step, pad_tokens, fake, target, reference=None) -> dict:
    new_batch, forward_loss = _batch_and_loss(acc, built, reference, scenario, pad_tokens, fake)
    return hf_step(acc, built, optimizer, step, target, new_batch, forward_loss, reference, batch_facts(scenario))


def hf_step(acc, built, optimizer, step, target, new_batch, forward_loss, reference=None, context=None) -> dict:
    """HF Trainer's training_step on `built` (OpenRLHF's DPO step with a `reference`), for any forward: the state
    labelled at both ends, `forward_loss` under the model's autocast, clip_grad_norm_, the optimizer step,
    zero_grad(set_to_none=True). The remote-code traces (qwen1.py, glm4.py) run their own files' forwards in it."""
    def forward(batch):
        autocast = built.autocast_dtype
        with torch.autocast("cpu", dtype=autocast) if autocast is not None else nullcontext():
            return forward_loss(batch)

    def optimizer_step():
        torch.nn.utils.clip_grad_norm_(built.trainable, MAX_GRAD_NORM, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return traced_step(acc, step, target, lambda: _label_state(acc, built, optimizer, reference), new_batch, forward,
                       optimizer_step, context)


def _extras(result: TraceResult) -> dict[str, int]:
    extras = {}
    opt = result.profile.phases.get("optimizer_step")
    end = result.marks.get("step_end")
    if opt is not None and end is not None:
        extras["optimizer_step_temporaries"] = opt.get("optimizer_states") - end.get("optimizer_states")
    fwd = result.marks.get("forward_end")
    if fwd is not None:
        extras["saved_activations_at_forward_end"] = fwd.get("activations")
        extras["logits_loss_at_forward_end"] = fwd.get("logits_loss")
    return extras


def _summary(scenario: Scenario) -> dict:
    m = scenario.model
    return {
        "model": m.id, "layers": m.num_layers, "hidden": m.hidden_size, "vocab": m.vocab_size,
        "tuning": scenario.tuning, "precision": scenario.precision, "optimizer": scenario.optimizer,
        "attention": scenario.attention, "checkpointing": scenario.checkpointing, "reentrant": scenario.reentrant,
        "padding": scenario.padding, "micro_batch": scenario.micro_batch, "seq_len": scenario.seq_len,
        "lora_rank": scenario.lora_rank if scenario.uses_adapters else None, "gpu": scenario.hardware.gpu.id,
    } | ({"method": scenario.method} if several_models(scenario.method) else {})


def _notes(scenario: Scenario, built: BuiltModel, fake: bool, target: CudaTarget, pad_tokens: int,
           reference: BuiltModel | None = None) -> list[str]:
    notes = list(built.notes)
    if reference is not None:
        notes.append(f"{scenario.method}: OpenRLHF DPOTrainer step on {2 * scenario.micro_batch} rows (chosen + "
                     f"rejected): policy forward, fp32 logits into flash_attn's cross entropy (stand-in), then "
                     f"a separate frozen 16-bit reference model under no_grad, then the loss")
    notes.append("fake tensors on the CPU (no memory, no math)" if fake else "real tensors on the CPU")
    notes.append(f"CUDA emulation for compute capability {target.compute_capability}: SDPA picks "
                 f"{'cuDNN, ' if target.prefer_cudnn else ''}flash, mem-efficient, math by torch's CUDA rules; "
                 f"kernels allocate and save what the CUDA kernels do (B,T,H,D outputs, fp32 logsumexp, "
                 f"backward workspaces)")
    if scenario.attention == "flash":
        notes.append("flash_attention_2: memfit stand-in with flash_attn's saved set (q, k, v, out, fp32 lse, rng)")
    if scenario.padding == "padded" and pad_tokens:
        notes.append(f"padded batch: {pad_tokens} padding position(s) at the end of the last row, so the batch "
                     f"carries a mask (SDPA mask path / flash unpad path) at the full token count")
    if built.autocast_dtype is not None:
        notes.append(f"autocast {str(built.autocast_dtype).removeprefix('torch.')} (CPU autocast with CUDA's op lists "
                     f"from torch's autocast_mode.h; cast copies of parameters are labelled weights)")
    if scenario.engine in ("deepspeed", "fsdp"):
        notes.append(f"{scenario.engine}: the module runs in the compute dtype; weights, gradients and "
                     f"optimizer states here are plain torch AdamW, not the engine's partitions (use measure)")
    if _host_scalar_steps_for(scenario):
        notes.append("optimizer `step` counters live on the host in CUDA runs (not counted)")
    notes.append("not modelled: CUDA context, cuBLAS workspace, allocator cache/fragmentation, NCCL")
    return notes


def _host_scalar_steps_for(scenario: Scenario) -> bool:
    return scenario.optimizer in ("adamw-foreach", "adamw-loop")


# ---------------------------------------------------------------------------------------------- per layer
def layer_profile(scenario: Scenario, **kwargs) -> dict[str, int]:
    """Per-decoder-layer bytes from two traces that differ by one layer (1 vs 2 layers).

    saved_per_layer: activations alive at the end of forward (what backward will need) per layer;
    forward/backward peak deltas per layer; and the layer-independent rest at forward end.
    """
    one = run_trace(scenario, num_layers=1, **kwargs)
    two = run_trace(scenario, num_layers=2, **kwargs)

    def delta(get):
        return get(two) - get(one)

    fwd_end = lambda r: r.marks["forward_end"].get("activations")  # noqa: E731
    return {
        "saved_per_layer": delta(fwd_end),
        "saved_outside_layers": fwd_end(one) - delta(fwd_end),
        "logits_loss_at_forward_end": one.marks["forward_end"].get("logits_loss"),
        "forward_peak_per_layer": delta(lambda r: r.profile.phases["forward"].total),
        "backward_peak_per_layer": delta(lambda r: r.profile.phases["backward"].total),
    }
