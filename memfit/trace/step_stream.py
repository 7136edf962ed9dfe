"""The allocation stream of real training steps, for the caching-allocator replay (memfit.trace.allocator).

One traced step (memfit.trace.run on fake tensors, the Accountant's event recorder on) gives every storage the
step allocates and frees, in order. Kept: what the step itself churns (activations, logits and loss, in the
forward and backward phases); the model states are one static allocation made before the first step (their
sizes are the estimate's, since the trace holds unpartitioned states). Under ZeRO-3 the stream also carries
what DeepSpeed allocates around each module: its parameters gathered to full size before the module's
forward (and the checkpointed recompute) and backward, freed after (module hooks, like DeepSpeed's
stage3 hooks; parameters under stage3_param_persistence_threshold stay gathered and are not churn), and each
gradient freed once its module's backward is done (reduce-scattered; prefetch and bucketing are not modelled).

Steps of other lengths: every storage size of a step is a polynomial of degree <= 2 in the sequence length
(s-sized activations, s^2 attention scores), so three traced lengths determine every size exactly; a fourth
trace checks it (`LengthModel.fit`). The stream's structure (which allocation, which free, in what order)
must be the same at every length, or the fit refuses.

A whole single-GPU run (`trace_run`): every allocation the trace sees, model states included, over several
steps: the parameters as the first step registers them (the order `model.to(device)` allocates them in), then
each step's forward, backward and optimizer step (gradients made in backward and freed by zero_grad, the optimizer
states created lazily by the first step, its foreach temporaries), with a mark after each phase. Only a
single-process run keeps its states in the trace's own tensors (no engine partitions them), so only it is whole.
"""
from __future__ import annotations

import math
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from fractions import Fraction
from itertools import count

from memfit.errors import MemfitError
from memfit.facts.scenario import Scenario

CHURN = ("activations", "logits_loss")  # categories a step allocates and frees itself
STEP_PHASES = ("forward", "backward")  # the optimizer step runs on ZeRO shards: not traced here


@dataclass(frozen=True)
class StepStream:
    """One step: ('+', i, bytes) allocates storage i, ('-', i) frees it; i numbers the step's allocations."""
    seq_len: int
    events: tuple

    def sizes(self) -> list[int]:
        return [e[2] for e in self.events if e[0] == "+"]

    def shape(self) -> tuple:
        return tuple(e[:2] for e in self.events)


# ---------------------------------------------------------------------------------------------- tracing
@contextmanager
def zero3_hooks(events: list, persistence: int):
    """Global module hooks that put DeepSpeed ZeRO-3's gathers into the recorded stream (see module doc)."""
    from torch.nn.modules import module as nn_module

    keys = count(1)
    held: dict[int, tuple] = {}  # id(module) -> key of its gathered parameters

    def gather(module, *_):
        # a module whose parameters are still gathered is not gathered again (DeepSpeed: ds_status AVAILABLE);
        # this happens when torch's checkpoint stops a recompute early, before the module's forward hook
        params = [p for p in module.parameters(recurse=False) if p.numel() > persistence]
        if params and id(module) not in held:
            held[id(module)] = key = ("gather", next(keys))
            events.append((1, key, sum(p.numel() * p.element_size() for p in params), None))

    def release(module, *_):
        key = held.pop(id(module), None)
        if key is not None:
            events.append((-1, key, 0, None))

    def release_after_backward(module, *_):
        release(module)
        events.append(("reduced",))  # gradients made so far are reduce-scattered and freed

    handles = [nn_module.register_module_forward_pre_hook(gather),
               nn_module.register_module_forward_hook(release),
               nn_module.register_module_full_backward_pre_hook(gather),
               nn_module.register_module_full_backward_hook(release_after_backward)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def trace_step(scenario: Scenario, seq_len: int) -> StepStream:
    """The allocation stream of one training step of `scenario` at `seq_len` tokens (fake tensors)."""
    from memfit.trace.run import run_trace

    zero3 = scenario.engine == "deepspeed" and scenario.zero_stage == 3
    raw: list = []
    hooks = zero3_hooks(raw, int(scenario.param_persistence_threshold)) if zero3 else nullcontext()
    with hooks, warnings.catch_warnings():
        # torch warns that module-level backward hooks see outputs, not inputs, where no input needs a gradient
        warnings.filterwarnings("ignore", message=".*backward hook", category=UserWarning)
        run_trace(scenario.with_changes(seq_len=seq_len), steps=1, events=raw)
    return StepStream(seq_len, tuple(_normalise(raw, zero3)))


def _normalise(raw: list, zero3: bool) -> list:
    """Keep the step's churn, number its allocations in order, free what is still held at the step's end."""
    out: list[tuple] = []  # ("+", serial, bytes) and ("-", serial)
    index: dict[int | tuple, int] = {}  # event key (a storage's serial, a ZeRO-3 gather) -> serial in this step
    pending: list[int | tuple] = []  # gradients' keys, freed when the reduction comes
    serials = count()

    def free(key):
        if key in index:
            out.append(("-", index.pop(key)))

    for ev in raw:
        if ev[0] == "reduced":
            for key in pending:
                free(key)
            pending.clear()
            continue
        sign, key, nbytes, rec = ev
        if sign == -1:
            free(key)
            continue
        keep = rec is None or (rec.phase in STEP_PHASES and (
            rec.category in CHURN or (zero3 and rec.category == "gradients")))
        if keep:
            index[key] = n = next(serials)
            out.append(("+", n, int(nbytes)))
            if rec is not None and rec.category == "gradients":
                pending.append(key)
    for key in list(index):
        free(key)
    return out


# ---------------------------------------------------------------------------------------------- lengths
@dataclass(frozen=True)
class LengthModel:
    """Every allocation's size as a polynomial in the sequence length, from traced steps."""
    shape: tuple
    coefficients: tuple  # per allocation: whole (n0, n1, n2, d) with size = (n0 + n1 s + n2 s^2) / d
    traced: tuple  # the lengths traced

    @classmethod
    def fit(cls, streams: list[StepStream]) -> "LengthModel":
        """Three streams fit; any more check the fit exactly."""
        if len(streams) < 3:
            raise MemfitError("a length model needs steps traced at three lengths or more")
        base = streams[0].shape()
        for st in streams[1:]:
            if st.shape() != base:
                raise MemfitError(f"the step at {st.seq_len} tokens allocates in another order than at "
                                  f"{streams[0].seq_len}: sizes cannot be interpolated between lengths")
        xs = [st.seq_len for st in streams[:3]]
        columns = list(zip(*(st.sizes() for st in streams[:3])))
        coefficients = tuple(_whole(_quadratic(xs, ys)) for ys in columns)
        model = cls(base, coefficients, tuple(st.seq_len for st in streams))
        for st in streams[3:]:
            if model.sizes(st.seq_len) != st.sizes():
                bad = sum(a != b for a, b in zip(model.sizes(st.seq_len), st.sizes()))
                raise MemfitError(f"{bad} allocation sizes at {st.seq_len} tokens are not quadratic in the length")
        return model

    def sizes(self, seq_len: int) -> list[int]:
        """Each allocation's bytes at seq_len (-1 where the polynomial gives no whole number of bytes >= 0)."""
        out = []
        for n0, n1, n2, d in self.coefficients:
            v, r = divmod(n0 + n1 * seq_len + n2 * seq_len * seq_len, d)
            out.append(v if r == 0 and v >= 0 else -1)
        return out

    def step(self, seq_len: int) -> StepStream:
        sizes = self.sizes(seq_len)
        if min(sizes, default=0) < 0:
            raise MemfitError(f"the length model gives no whole size at {seq_len} tokens")
        events = tuple(("+", e[1], sizes[e[1]]) if e[0] == "+" else e for e in self.shape)
        return StepStream(seq_len, events)


def _quadratic(xs: list[int], ys: tuple[int, ...]) -> tuple[Fraction, Fraction, Fraction]:
    """The polynomial c0 + c1 x + c2 x^2 through three points (Lagrange, exact)."""
    c = [Fraction(0)] * 3
    for i, (xi, yi) in enumerate(zip(xs, ys)):
        a, b = [xs[j] for j in range(3) if j != i]
        d = Fraction(yi, (xi - a) * (xi - b))
        c[0] += d * a * b
        c[1] -= d * (a + b)
        c[2] += d
    return c[0], c[1], c[2]


def _whole(c: tuple[Fraction, Fraction, Fraction]) -> tuple[int, int, int, int]:
    d = math.lcm(*(x.denominator for x in c))
    c0, c1, c2 = (int(x * d) for x in c)
    return c0, c1, c2, d


def run_stream(steps: list[StepStream], static_bytes: int = 0) -> list:
    """The replay's input: the model states as one allocation, then each step's stream and a mark after it."""
    out: list[tuple] = [(1, ("static",), static_bytes)] if static_bytes else []
    for n, st in enumerate(steps):
        for e in st.events:
            out.append((1, (n, e[1]), e[2]) if e[0] == "+" else (-1, (n, e[1])))
        out.append(("mark", (n, st.seq_len)))
    return out


# ---------------------------------------------------------------------------------------------- whole runs
@dataclass(frozen=True)
class PhaseLoad:
    """What a traced phase peaks at (the last step's), in the estimate's terms."""
    allocated: int  # the phase's allocated peak
    churn: int  # bytes at that peak that the step allocates and frees itself (memfit.memory.phases._churn)


@dataclass(frozen=True)
class RunStream:
    events: tuple  # the replay's input (memfit.trace.allocator.Replayer.feed), marks labelled (step, phase)
    phases: dict  # phase -> PhaseLoad of the last traced step


def trace_run(scenario: Scenario, steps: int = 3) -> RunStream:
    """The allocation stream of `steps` whole training steps of a single-process `scenario` (fake tensors)."""
    from memfit.trace.run import run_trace

    if scenario.engine != "single":
        raise MemfitError(f"a whole-run stream is traced for engine 'single' (one GPU), not {scenario.engine!r}: "
                          f"the trace holds unpartitioned model states and one stream")
    raw: list = []
    result = run_trace(scenario, steps=steps, events=raw)
    temporaries = result.extras.get("optimizer_step_temporaries", 0)
    phases = {}
    for name, b in result.profile.phases.items():
        churn = b.get("activations") + b.get("logits_loss") + (temporaries if name == "optimizer_step" else 0)
        phases[name] = PhaseLoad(b.total, churn)
    return RunStream(tuple(_marked(raw)), phases)


def _marked(raw: list) -> list:
    """Recorded (+1|-1, serial, bytes, record) events as replay events, a ("mark", (step, phase)) closing each
    phase: a phase ends where the next one's first allocation comes (frees between change no peak)."""
    out: list[tuple] = []
    phase, step = None, 0
    for sign, key, nbytes, rec in raw:
        if sign == -1:
            out.append((-1, key))
            continue
        if rec.phase != phase:
            if phase is not None:
                out.append(("mark", (step, phase)))
                step += rec.phase == "forward"
            phase = rec.phase
        out.append((1, key, int(nbytes)))
    if phase is not None:
        out.append(("mark", (step, phase)))
    return out
