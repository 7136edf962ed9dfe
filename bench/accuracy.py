"""memfit's analytic estimate vs the fake-tensor trace of the real transformers/PEFT step, over a grid.

    python bench/accuracy.py                      # table + summary (trace results come from the cache)
    python bench/accuracy.py --summary-json       # {"n", "median_abs_pct_error", "max_abs_pct_error", "phase_agreement",
                                                  #  "groups": {"dpo": {...}, "moe": {...}}}
    python bench/accuracy.py --quick              # ~20 rows
    python bench/accuracy.py --rows qwen3,lora    # rows whose id contains every comma-separated part
    python bench/accuracy.py --refresh --jobs 2   # re-trace (the selected rows) instead of reading the cache

Every row is one single-GPU, plain-PyTorch (engine single) run on an A100-80GB: a catalog model x
full/LoRA x checkpointing x attention x micro-batch x sequence length x bf16-pure/bf16-mixed x
foreach/fused AdamW. The headline summary is the 162-row SFT grid's; groups beside it add DPO rows (OpenRLHF's
step: policy + frozen bf16 reference on chosen + rejected rows, against the estimate) and more MoE
families, summarised as groups. For each row the estimate's *allocated* profile is compared with the trace's:
- total peak: the estimate counts only the categories the trace models (weights, gradients,
  optimizer states, activations, logits/loss); its runtime_overhead (cuBLAS workspace) and
  engine_buffers are left out, because the trace does not model them;
- activation peak: the largest activations + logits_loss over the phases (at each phase's peak
  moment), i.e. the at-peak value whenever the peak falls in forward or backward;
- peak phase.

Trace cache: the trace is deterministic for a given scenario, torch/transformers/peft and trace code,
and the full grid takes 25-45 minutes to trace on 2 cores (--jobs 2), so results live in
bench/trace_cache.json, keyed by a fingerprint of what the trace reads from the scenario
(TRACE_INPUTS, the model's architecture, the GPU's compute capability). The file is meant to be committed: a re-run after an analytic-model
change takes seconds, CI and machines without torch can run the bench, and a refresh shows up as a
reviewable diff. Each entry records the library versions and a hash of memfit/trace/*.py; entries
from other versions or trace code are still used, but counted as stale in the output, and
`--refresh-stale` re-traces just those, and `--restamp` re-traces the --quick rows and, if they match
the cache exactly, marks every entry current (for trace changes that do not touch the grid).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memfit.breakdown import Breakdown, PhaseProfile  # noqa: E402
from memfit.facts.catalog import ModelSpec, find_gpu, find_model  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402
from memfit.roles.estimate import estimate
from memfit.roles.result import Estimate  # noqa: E402
from memfit.facts.knobs import acting_when, knobs  # noqa: E402
from memfit.facts.methods import framework_facts, several_models  # noqa: E402
from memfit.facts.profiles import build_scenario  # noqa: E402
from memfit.facts.scenario import Hardware, Scenario  # noqa: E402

CACHE_PATH = ROOT / "bench" / "trace_cache.json"
ROWS_PATH = ROOT / "bench" / "accuracy_rows.json"
CACHE_SCHEMA = "memfit.trace_cache/1"
GPU_ID = "a100-80gb"
TRACE_STEPS = 2  # run_trace default: the second step is the steady state (optimizer states exist)
PAD_TOKENS = 1  # run_trace default: a padded batch carries a mask
# The categories the trace models; the estimate's other ones (runtime_overhead, engine_buffers) are
# not part of the comparison.
COMPARED = ("weights", "gradients", "optimizer_states", "activations", "logits_loss")
ACTIVATION_PARTS = ("activations", "logits_loss")
STEP_PHASES = ("forward", "backward", "optimizer_step")
GIB = 2**30


# ---------------------------------------------------------------------------------------------- the grid
@dataclass(frozen=True)
class GridRow:
    """One configuration. `model` is a catalog name, or a ModelSpec (tests use tiny ones)."""

    label: str  # short model name for the row id
    model: str | ModelSpec
    tuning: str = "full"
    checkpointing: str = "off"
    attention: str = "sdpa"
    micro_batch: int = 1
    seq_len: int = 512
    precision: str = "bf16-pure"
    optimizer: str = "adamw-foreach"
    lora_rank: int = 16
    padding: str | None = None  # None = the hf-trainer default (padded)
    method: str = "sft"  # dpo: OpenRLHF's DPO step (policy + reference, chosen + rejected rows)

    @property
    def id(self) -> str:
        tuning = f"lora{self.lora_rank}" if self.tuning == "lora" else self.tuning
        ckpt = "ckpt" if self.checkpointing != "off" else "nockpt"
        opt = self.optimizer.removeprefix("adamw-")
        pad = f"/{self.padding}" if self.padding else ""
        method = "" if self.method == "sft" else f"{self.method}/"
        return (f"{method}{self.label}/{tuning}/{self.precision}/{opt}/{self.attention}/{ckpt}/"
                f"b{self.micro_batch}x{self.seq_len}{pad}")

    @property
    def profile(self) -> str:
        return "hf-trainer" if self.method == "sft" else "openrlhf"  # the layout the DPO trace runs

    def knobs(self) -> dict:
        knobs = {"engine": "single", "tuning": self.tuning, "precision": self.precision,
                 "optimizer": self.optimizer, "checkpointing": self.checkpointing, "attention": self.attention,
                 "micro_batch": self.micro_batch, "seq_len": self.seq_len, "padding": self.padding}
        if self.tuning == "lora":
            knobs["lora_rank"] = self.lora_rank
        if self.method != "sft":
            knobs["method"] = self.method
        return knobs

    def scenario(self) -> Scenario:
        spec = find_model(self.model) if isinstance(self.model, str) else self.model
        hardware = Hardware(gpu=find_gpu(GPU_ID), gpus_per_node=1)
        return build_scenario(spec, hardware, self.knobs(), self.profile)


ALL_ATTENTION = ("eager", "sdpa", "flash")
# (label, catalog name, attention implementations the trace runs for it)
SMALL_MODELS = (
    ("llama3.2-1b", "meta-llama/Llama-3.2-1B", ALL_ATTENTION),
    ("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", ALL_ATTENTION),
    ("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B", ALL_ATTENTION),
    ("qwen3-0.6b", "Qwen/Qwen3-0.6B", ALL_ATTENTION),
    ("gemma2-2b", "google/gemma-2-2b", ("eager",)),  # transformers refuses sdpa for gemma2 (softcapping)
    ("santacoder", "bigcode/gpt_bigcode-santacoder", ALL_ATTENTION),
    ("starcoder2-3b", "bigcode/starcoder2-3b", ALL_ATTENTION),
    ("phi3-mini", "microsoft/Phi-3-mini-4k-instruct", ALL_ATTENTION),
)
BIG_MODELS = (
    ("llama3.1-8b", "meta-llama/Llama-3.1-8B", ("sdpa", "flash")),
    ("mistral-7b", "mistralai/Mistral-7B-v0.1", ("sdpa", "eager")),
    ("qwen2.5-7b", "Qwen/Qwen2.5-7B", ("flash", "eager")),
    ("qwen3-8b", "Qwen/Qwen3-8B", ("sdpa", "flash")),
    ("glm4-9b", "THUDM/glm-4-9b-chat-hf", ("sdpa", "eager")),
)
MOE_MODELS = (("mixtral-8x7b", "mistralai/Mixtral-8x7B-Instruct-v0.1", ("sdpa", "flash")),)
# (micro-batch, sequence length) rotations: every size from 512 to 8192, batches 1, 2, 4
SMALL_SHAPES = ((1, 512), (2, 1024), (4, 512), (1, 2048), (2, 2048), (1, 4096), (4, 1024), (2, 512),
                (1, 1024), (4, 2048), (1, 8192), (2, 4096))
BIG_SHAPES = ((1, 2048), (2, 1024), (4, 2048), (1, 4096), (1, 8192), (2, 2048), (4, 1024), (1, 512))


def _pick(options: tuple, *key) -> object:
    """A fixed, well-mixed choice (so precision/optimizer do not line up with the other axes)."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return options[digest[0] % len(options)]


def _row(label, name, tuning, ckpt, attn, shape, **extra) -> GridRow:
    key = (label, tuning, ckpt, attn, shape)
    precision = extra.pop("precision", None) or _pick(("bf16-pure", "bf16-mixed"), "precision", *key)
    optimizer = extra.pop("optimizer", None) or _pick(("adamw-foreach", "adamw-fused"), "optimizer", *key)
    rank = extra.pop("lora_rank", None) or _pick((8, 16, 64), "rank", *key)
    return GridRow(label, name, tuning, ckpt, attn, shape[0], shape[1], precision, optimizer, rank, **extra)


def grid() -> list[GridRow]:
    rows: list[GridRow] = []
    for m, (label, name, attns) in enumerate(SMALL_MODELS):
        core = [(t, c, a) for t in ("full", "lora") for c in ("off", "full") for a in attns]
        for i, (tuning, ckpt, attn) in enumerate(core):
            rows.append(_row(label, name, tuning, ckpt, attn, SMALL_SHAPES[(i + 5 * m) % len(SMALL_SHAPES)]))
        sweep_attn = "sdpa" if "sdpa" in attns else attns[0]
        fast_attn = "flash" if "flash" in attns else attns[0]
        rows += [
            _row(label, name, "full", "full", sweep_attn, (4, 4096)),
            _row(label, name, "lora", "off", sweep_attn, (1, 8192)),
            _row(label, name, "lora", "full", fast_attn, (4, 8192)),
            _row(label, name, "full", "off", attns[0], (2, 2048), padding="packed"),
        ]
    for m, (label, name, attns) in enumerate(BIG_MODELS):
        core = [(t, c, a) for t in ("full", "lora") for c in ("off", "full") for a in attns]
        for i, (tuning, ckpt, attn) in enumerate(core):
            rows.append(_row(label, name, tuning, ckpt, attn, BIG_SHAPES[(i + 3 * m) % len(BIG_SHAPES)]))
    for label, name, attns in MOE_MODELS:
        # MoE full tuning runs bf16-pure: transformers' grouped_mm experts need bf16 weights
        rows += [
            _row(label, name, "lora", "full", attns[0], (1, 4096)),
            _row(label, name, "lora", "off", attns[1], (2, 1024)),
            _row(label, name, "full", "full", attns[1], (1, 2048), precision="bf16-pure"),
            _row(label, name, "full", "off", attns[0], (1, 512), precision="bf16-pure"),
        ]
    seen: set[str] = set()
    unique = []
    for r in rows:
        if r.id not in seen:
            seen.add(r.id)
            unique.append(r)
    return unique


# Rows outside the 162-row SFT scoreboard (`grid()`), so its summary stays comparable over time.
# DPO: OpenRLHF's step on one GPU (2 x micro-batch rows; a separate bf16 reference, LoRA or not).
DPO_MODELS = (
    ("llama3.2-1b", "meta-llama/Llama-3.2-1B", ("sdpa", "eager")),
    ("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", ("sdpa", "flash")),  # flash: OpenRLHF's default attention
    ("qwen3-0.6b", "Qwen/Qwen3-0.6B", ("sdpa", "eager")),
)
DPO_SHAPES = ((1, 512), (2, 2048), (2, 512), (1, 2048))  # (preference pairs per micro-batch, tokens per row)
# more MoE families: transformers' grouped experts; full tuning runs bf16-pure (see MOE_MODELS)
MORE_MOE_MODELS = (("qwen1.5-moe", "Qwen/Qwen1.5-MoE-A2.7B"), ("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B"))


def dpo_grid() -> list[GridRow]:
    rows = []
    for m, (label, name, attns) in enumerate(DPO_MODELS):
        core = [(t, c, a) for t in ("full", "lora") for c in ("off", "full") for a in attns]
        for i, (tuning, ckpt, attn) in enumerate(core):
            rows.append(_row(label, name, tuning, ckpt, attn, DPO_SHAPES[(i + m) % len(DPO_SHAPES)], method="dpo"))
    for label, name in MORE_MOE_MODELS:
        rows.append(_row(label, name, "full", "full", "sdpa", (1, 1024), precision="bf16-pure", method="dpo"))
    return rows


def moe_grid() -> list[GridRow]:
    """MoE families beyond the grid's Mixtral."""
    rows = []
    for label, name in MORE_MOE_MODELS:
        rows += [
            _row(label, name, "lora", "full", "sdpa", (1, 2048)),
            _row(label, name, "full", "full", "sdpa", (1, 2048), precision="bf16-pure"),
            _row(label, name, "full", "off", "flash", (2, 1024), precision="bf16-pure"),
        ]
    return rows


def all_rows() -> list[GridRow]:
    return grid() + moe_grid() + dpo_grid()


def is_moe(row: GridRow) -> bool:
    spec = find_model(row.model) if isinstance(row.model, str) else row.model
    return spec.is_moe


GROUPS = {"dpo": lambda r: r.method != "sft", "moe": is_moe}  # group summaries printed beside the SFT grid's


def quick_grid() -> list[GridRow]:
    """About 20 rows: every 8th row of the grid (the grid interleaves models, tunings and attentions)."""
    return grid()[::8]


def select(rows: list[GridRow], pattern: str | None) -> list[GridRow]:
    """--rows: comma-separated alternatives; each a '+'-joined set of substrings that must all occur."""
    if not pattern:
        return rows
    alternatives = [[p for p in alt.split("+") if p] for alt in pattern.split(",") if alt]
    return [r for r in rows if any(all(p in r.id for p in parts) for parts in alternatives)]


# ---------------------------------------------------------------------------------------------- the cache
# catalog documentation and the scenario's list of assumed defaults: they change no tensor
_DOC_FIELDS = {"aliases", "params_source", "config_source", "published_params", "source", "name", "assumed"}
_OFF = (None, False, 0, "", "none", "off", (), [], {})


def _field_default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _plain(obj):
    """Canonical data of a scenario. A field left at an "off" default (None, False, 0, "none", empty) is
    omitted, so adding a switched-off knob to Scenario/ModelSpec keeps every fingerprint (and the cache)
    valid; any other value, or a changed default, changes the fingerprint."""
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name in _DOC_FIELDS or (value in _OFF and type(value) is type(_field_default(f))
                                         and value == _field_default(f)):
                continue
            out[f.name] = _plain(value)
        return out
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in sorted(obj.items())}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


# What memfit/trace reads from a Scenario (grep "scenario\." memfit/trace). The key holds only these, the
# model's architecture and the GPU's compute capability (CudaTarget.for_gpu), so knobs the trace never
# reads (RL roles, host RAM, GPU memory size, ...) can be added to Scenario without re-tracing. When the
# trace code starts reading something new, its hash changes, every entry is marked stale, and the new
# input belongs in this list. Knobs that act only under another engine or without adapters are left out
# (memfit/facts/data/knobs.toml `when`): their values change no traced tensor.
TRACE_INPUTS = ("tuning", "lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "dora", "precision",
                "runs_autocast", "adapter_dtype", "optimizer", "engine", *acting_when("deepspeed"),
                *acting_when("fsdp"), "checkpointing", "checkpoint_every_n", "reentrant", "attention", "padding",
                "loss", "micro_batch", "seq_len", "freeze_trainable_layers", "kbit_upcast", "double_quant")
# the DPO trace also reads the method, the reference model it builds and its framework's facts
DPO_TRACE_INPUTS = ("method", "ref_model", "precompute_ref_log_probs", "ref_offload")


def _acts(scenario: Scenario, name: str) -> bool:
    when = knobs().get(name).when if name in knobs() else None
    return {"deepspeed": scenario.engine == "deepspeed", "fsdp": scenario.engine == "fsdp",
            "adapters": scenario.uses_adapters}.get(when, True)


# ModelSpec facts that only the analytic model reads (the trace takes them from transformers' own config
# classes), so adding one does not invalidate the cached traces
ANALYTIC_ONLY_MODEL_FACTS = ("norm_fp32_scale", "attn_softcap", "logit_softcap", "dropout", "eager_repeats_kv")


def fingerprint(scenario: Scenario) -> str:
    doc = {name: _plain(getattr(scenario, name)) for name in TRACE_INPUTS if _acts(scenario, name)}
    if several_models(scenario.method):
        fw = framework_facts(scenario.profile)
        doc |= {name: _plain(getattr(scenario, name)) for name in DPO_TRACE_INPUTS}
        doc["framework"] = {k: fw[k] for k in ("lora_ref", "logits")}
    model = _plain(scenario.model)
    if isinstance(model, dict):
        model = {k: v for k, v in model.items() if k not in ANALYTIC_ONLY_MODEL_FACTS}
    doc |= {"model": model, "compute_capability": scenario.hardware.gpu.compute_capability,
            "steps": TRACE_STEPS, "pad_tokens": PAD_TOKENS}
    text = json.dumps(doc, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@functools.cache
def trace_code_hash() -> str:
    """Of memfit/trace/*.py as this process first sees them (a worker: just after importing them)."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "memfit" / "trace").glob("*.py")):
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:12]


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "peft"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


class TraceCache:
    """fingerprint -> trace result (profile, marks, kernels, extras) or the trace's refusal."""

    def __init__(self, path: Path = CACHE_PATH):
        self.path = Path(path)
        self.entries: dict[str, dict] = {}
        if self.path.exists():
            doc = json.loads(self.path.read_text())
            if doc.get("schema") == CACHE_SCHEMA:
                self.entries = doc.get("entries", {})

    def get(self, key: str) -> dict | None:
        return self.entries.get(key)

    def put(self, key: str, entry: dict) -> None:
        self.entries[key] = entry

    def save(self) -> None:
        """One entry per line (readable diffs), written atomically."""
        lines = [f"{json.dumps(k)}: {json.dumps(self.entries[k], sort_keys=True, separators=(',', ':'))}"
                 for k in sorted(self.entries)]
        entries = ",\n".join(lines)
        body = f'{{"schema": "{CACHE_SCHEMA}",\n"entries": {{\n{entries}\n}}}}\n'
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(body)
        os.replace(tmp, self.path)


def is_stale(entry: dict, code_hash: str, versions: dict | None) -> bool:
    return entry.get("trace_code") != code_hash or (versions is not None and entry.get("versions") != versions)


def trace_entry(row: GridRow) -> dict:
    """Run the trace of one row (in this process) and keep what the comparison needs."""
    import warnings

    from memfit.trace import run_trace

    scenario = row.scenario()
    entry = {"row": row.id, "versions": library_versions(), "trace_code": trace_code_hash()}
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = run_trace(scenario, steps=TRACE_STEPS, pad_tokens=PAD_TOKENS)
    except MemfitError as e:
        entry["refused"] = str(e)
        return entry
    entry.update({
        "seconds": round(time.perf_counter() - started, 2),
        "profile": {p: b.to_json() for p, b in result.profile.phases.items()},
        "marks": {name: b.to_json() for name, b in result.marks.items()},
        "kernels": result.kernels,
        "extras": result.extras,
        "notes": result.notes,
    })
    return entry


def _worker(row: GridRow) -> tuple[str, dict]:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import memfit.trace.run  # noqa: F401 - import first, then hash the code that was imported
    trace_code_hash()
    return fingerprint(row.scenario()), trace_entry(row)


def fill_cache(rows: list[GridRow], cache: TraceCache, refresh: bool = False, refresh_stale: bool = False,
               jobs: int = 1, log=print) -> float:
    """Trace the rows the cache lacks (or all of them with refresh); save after every row. Returns seconds."""
    code, versions = None, None
    todo = []
    for row in rows:
        key = fingerprint(row.scenario())
        entry = cache.get(key)
        if refresh_stale and entry is not None:
            code, versions = code or trace_code_hash(), versions or library_versions()
            if is_stale(entry, code, versions):
                entry = None
        if refresh or entry is None:
            todo.append(row)
    if not todo:
        return 0.0
    started = time.perf_counter()
    log(f"tracing {len(todo)} row(s) with {jobs} worker(s) ...")
    if jobs <= 1:
        results = (_worker(r) for r in todo)
        _collect(results, todo, cache, started, log)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            futures = [pool.submit(_worker, r) for r in todo]
            _collect((f.result() for f in as_completed(futures)), todo, cache, started, log)
    return time.perf_counter() - started


def _collect(results, todo, cache, started, log) -> None:
    for done, (key, entry) in enumerate(results, 1):
        cache.put(key, entry)
        cache.save()
        what = f"refused: {entry['refused'][:80]}" if "refused" in entry else f"{entry['seconds']:.1f} s"
        log(f"  [{done}/{len(todo)}] {entry['row']}  {what}  ({time.perf_counter() - started:.0f} s)")


def restamp(cache: TraceCache, check_rows: list[GridRow], jobs: int = 1, log=print) -> bool:
    """After a memfit/trace change that should not move the grid (a new family, a refactor): re-trace
    `check_rows` into a scratch cache, and only if every one matches its cached entry exactly (profile,
    marks, kernels) stamp every entry with the current trace code and versions. Returns success."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        scratch = TraceCache(Path(tmp) / "check.json")
        fill_cache(check_rows, scratch, jobs=jobs, log=log)
    differ = []
    for row in check_rows:
        key = fingerprint(row.scenario())
        old, new = cache.get(key), scratch.get(key)
        if old is None or new is None or any(old.get(k) != new.get(k) for k in ("profile", "marks", "kernels",
                                                                                "refused")):
            differ.append(row.id)
    if differ:
        log(f"not restamped: {len(differ)} of {len(check_rows)} re-traced rows differ from the cache "
            f"(run --refresh-stale): {', '.join(differ[:10])}")
        return False
    code, versions = trace_code_hash(), library_versions()
    for entry in cache.entries.values():
        entry["trace_code"], entry["versions"] = code, versions
    cache.save()
    log(f"restamped {len(cache.entries)} entries with trace code {code}: {len(check_rows)} re-traced rows identical")
    return True


# ---------------------------------------------------------------------------------------------- comparing
def _profile_from_json(phases: dict) -> PhaseProfile:
    return PhaseProfile({p: Breakdown({c: v for c, v in b.items() if c != "total"}) for p, b in phases.items()})


def comparable(b: Breakdown) -> Breakdown:
    return Breakdown({c: b.get(c) for c in COMPARED})


def _activation_peak(profile: PhaseProfile) -> int:
    return max((sum(profile.phases[p].get(c) for c in ACTIVATION_PARTS) for p in STEP_PHASES
                if p in profile.phases), default=0)


def _pct(estimated: int, traced: int) -> float | None:
    return None if traced == 0 else 100.0 * (estimated - traced) / traced


@dataclass
class Comparison:
    row: GridRow
    key: str
    status: str = "ok"  # ok / refused (the trace refuses the scenario) / untraced / error
    reason: str = ""
    estimate: PhaseProfile | None = None  # allocated, compared categories only, training phases
    trace: PhaseProfile | None = None
    trace_seconds: float | None = None
    stale: bool = False
    runtime_overhead: int = 0  # estimate bytes left out of the comparison
    details: dict = field(default_factory=dict)  # trace marks / extras / kernels

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def est_total(self) -> int:
        return self.estimate.peak.total

    @property
    def trace_total(self) -> int:
        return self.trace.peak.total

    @property
    def total_error(self) -> float:
        return _pct(self.est_total, self.trace_total)

    @property
    def est_act(self) -> int:
        return _activation_peak(self.estimate)

    @property
    def trace_act(self) -> int:
        return _activation_peak(self.trace)

    @property
    def act_error(self) -> float | None:
        return _pct(self.est_act, self.trace_act)

    @property
    def phase_agrees(self) -> bool:
        return self.estimate.peak_phase == self.trace.peak_phase

    def deltas_at_peak(self) -> dict[str, int]:
        """estimate minus trace, per category, each at its own peak."""
        return {c: self.estimate.peak.get(c) - self.trace.peak.get(c) for c in COMPARED}

    def to_json(self) -> dict:
        out = {"id": self.row.id, "fingerprint": self.key, "status": self.status,
               "knobs": {k: v for k, v in self.row.knobs().items() if v is not None},
               "model": self.row.model if isinstance(self.row.model, str) else self.row.model.id}
        if not self.ok:
            return out | {"reason": self.reason}
        return out | {
            "total_peak": {"estimate": self.est_total, "trace": self.trace_total,
                           "error_pct": round(self.total_error, 3)},
            "activation_peak": {"estimate": self.est_act, "trace": self.trace_act,
                                "error_pct": None if self.act_error is None else round(self.act_error, 3)},
            "peak_phase": {"estimate": self.estimate.peak_phase, "trace": self.trace.peak_phase},
            "delta_at_peak": self.deltas_at_peak(),
            "phases": {p: {"estimate": self.estimate.phases[p].to_json(), "trace": self.trace.phases[p].to_json()}
                       for p in STEP_PHASES if p in self.trace.phases and p in self.estimate.phases},
            "estimate_left_out": {"runtime_overhead": self.runtime_overhead},
            "trace_marks": self.details.get("marks", {}),
            "trace_extras": self.details.get("extras", {}),
            "trace_kernels": self.details.get("kernels", {}),
            "trace_seconds": self.trace_seconds,
            "stale_trace": self.stale,
        }


def compare(row: GridRow, scenario: Scenario, est: Estimate, entry: dict, stale: bool = False) -> Comparison:
    key = fingerprint(scenario)
    if "refused" in entry:
        return Comparison(row, key, "refused", entry["refused"])
    alloc = est.allocated
    estimate_profile = PhaseProfile({p: comparable(alloc.phases[p]) for p in STEP_PHASES if p in alloc.phases})
    trace_profile = _profile_from_json({p: b for p, b in entry["profile"].items() if p in STEP_PHASES})
    trace_profile = PhaseProfile({p: comparable(b) for p, b in trace_profile.phases.items()})
    return Comparison(row, key, "ok", "", estimate_profile, trace_profile, entry.get("seconds"), stale,
                      alloc.peak.get("runtime_overhead") + alloc.peak.get("engine_buffers"),
                      {k: entry.get(k, {}) for k in ("marks", "extras", "kernels")})


def evaluate(rows: list[GridRow], cache: TraceCache) -> list[Comparison]:
    code, versions = trace_code_hash(), library_versions()
    out = []
    for row in rows:
        try:
            scenario = row.scenario()
            key = fingerprint(scenario)
            entry = cache.get(key)
            if entry is None:
                out.append(Comparison(row, key, "untraced", "not in the trace cache (run with --refresh)"))
                continue
            est = estimate(scenario) if row.method != "sft" else estimate(scenario)
        except MemfitError as e:
            out.append(Comparison(row, "", "error", f"estimate: {e}"))
            continue
        out.append(compare(row, scenario, est, entry, is_stale(entry, code, versions)))
    return out


# ---------------------------------------------------------------------------------------------- summary
def summary(comparisons: list[Comparison]) -> dict:
    ok = [c for c in comparisons if c.ok]
    errs = [abs(c.total_error) for c in ok]
    return {
        "n": len(ok),
        "median_abs_pct_error": round(statistics.median(errs), 2) if errs else None,
        "max_abs_pct_error": round(max(errs), 2) if errs else None,
        "phase_agreement": round(sum(c.phase_agrees for c in ok) / len(ok), 4) if ok else None,
    }


def scoreboard(comparisons: list[Comparison]) -> list[Comparison]:
    """The rows of the 162-row SFT grid: the headline summary, comparable across versions."""
    ids = {r.id for r in grid()}
    return [c for c in comparisons if c.row.id in ids]


def group_summaries(comparisons: list[Comparison]) -> dict:
    """Median / max |error| of the groups beside the SFT grid (DPO rows, MoE rows from both lists)."""
    return {name: summary([c for c in comparisons if member(c.row)]) for name, member in GROUPS.items()}


def extended_summary(comparisons: list[Comparison]) -> dict:
    ok = [c for c in comparisons if c.ok]
    act = [abs(c.act_error) for c in ok if c.act_error is not None]
    models = {c.row.model if isinstance(c.row.model, str) else c.row.model.id for c in ok}
    families = {(find_model(m).arch if isinstance(m, str) else m) for m in models}
    by_status: dict[str, int] = {}
    for c in comparisons:
        by_status[c.status] = by_status.get(c.status, 0) + 1
    return summary(comparisons) | {
        "activation_median_abs_pct_error": round(statistics.median(act), 2) if act else None,
        "activation_max_abs_pct_error": round(max(act), 2) if act else None,
        "within_2pct": sum(abs(c.total_error) <= 2 for c in ok),
        "within_8pct": sum(abs(c.total_error) <= 8 for c in ok),
        "models": len(models), "families": len(families),
        "rows_by_status": by_status,
        "stale_traces": sum(c.stale for c in ok),
    }


def _gib(b: int) -> str:
    return f"{b / GIB:.2f}"


def _err(e: float | None) -> str:
    return "" if e is None else f"{e:+.1f}"


def _worst_delta(c: Comparison) -> str:
    deltas = c.deltas_at_peak()
    cat = max(deltas, key=lambda k: abs(deltas[k]))
    return f"{cat} {deltas[cat] / GIB:+.2f}" if deltas[cat] else ""


def print_table(comparisons: list[Comparison], console=None, title: str = "memfit estimate vs trace") -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=200)
    table = Table(title=f"{title} (allocated GiB; err % = (estimate - trace) / trace)")
    for col, justify in (("row", "left"), ("est peak", "right"), ("trace peak", "right"), ("err %", "right"),
                         ("est act", "right"), ("trace act", "right"), ("act err %", "right"),
                         ("peak phase est / trace", "left"), ("largest delta at peak (GiB)", "left")):
        table.add_column(col, justify=justify, no_wrap=col == "row")
    for c in comparisons:
        if not c.ok:
            table.add_row(c.row.id, "", "", "", "", "", "", f"[dim]{c.status}[/]", f"[dim]{c.reason[:70]}[/]")
            continue
        err = c.total_error
        style = "red" if abs(err) > 8 else ("yellow" if abs(err) > 2 else "green")
        phase = (f"{c.estimate.peak_phase}" if c.phase_agrees
                 else f"[red]{c.estimate.peak_phase} / {c.trace.peak_phase}[/]")
        table.add_row(c.row.id + (" [dim](stale)[/]" if c.stale else ""), _gib(c.est_total), _gib(c.trace_total),
                      f"[{style}]{err:+.1f}[/]", _gib(c.est_act), _gib(c.trace_act), _err(c.act_error), phase,
                      _worst_delta(c))
    console.print(table)


def write_rows(comparisons: list[Comparison], path: Path = ROWS_PATH) -> None:
    doc = {"schema": "memfit.accuracy_rows/1", "gpu": GPU_ID,
           "compared_categories": list(COMPARED), "summary": extended_summary(scoreboard(comparisons)),
           "groups": group_summaries(comparisons),
           "rows": [c.to_json() for c in comparisons]}
    path.write_text(json.dumps(doc, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--summary-json", action="store_true", help="print only the summary as JSON")
    p.add_argument("--quick", action="store_true", help="about 20 rows")
    p.add_argument("--rows", help="filter: comma-separated alternatives of '+'-joined id substrings")
    p.add_argument("--refresh", action="store_true", help="re-trace the selected rows")
    p.add_argument("--refresh-stale", action="store_true", help="re-trace rows traced by other trace code/versions")
    p.add_argument("--restamp", action="store_true",
                   help="re-trace the --quick rows (or --rows); if all match the cache, mark every entry current")
    p.add_argument("--no-trace", action="store_true", help="never trace; rows missing from the cache are listed")
    p.add_argument("--jobs", type=int, default=1, help="parallel trace processes (default 1)")
    p.add_argument("--cache", default=str(CACHE_PATH))
    p.add_argument("--rows-json", default=str(ROWS_PATH), help="per-row details (estimate vs trace per category)")
    p.add_argument("--worst", type=int, default=15, help="rows in the worst-rows table")
    a = p.parse_args(argv)
    rows = select(quick_grid() if a.quick else all_rows(), a.rows)
    if not rows:
        print("accuracy.py: error: no grid row matches --rows", file=sys.stderr)
        return 2
    cache = TraceCache(Path(a.cache))
    log = (lambda *x: print(*x, file=sys.stderr)) if a.summary_json else print
    if a.restamp:
        return 0 if restamp(cache, select(quick_grid(), a.rows), a.jobs, log) else 1
    traced_s = 0.0
    if not a.no_trace:
        traced_s = fill_cache(rows, cache, a.refresh, a.refresh_stale, a.jobs, log)
    if not a.quick and not a.rows:  # a full run drops entries no grid row uses (old keys) from the file
        used = {fingerprint(r.scenario()) for r in rows}
        unused = [k for k in cache.entries if k not in used]
        for k in unused:
            del cache.entries[k]
        if unused:
            cache.save()
            log(f"dropped {len(unused)} cache entries no grid row uses")
    started = time.perf_counter()
    comparisons = evaluate(rows, cache)
    compare_s = time.perf_counter() - started
    if a.rows_json and not a.quick and not a.rows:
        write_rows(comparisons, Path(a.rows_json))
    if a.summary_json:  # the SFT grid's summary, then the DPO and MoE groups'
        print(json.dumps(summary(scoreboard(comparisons)) | {"groups": group_summaries(comparisons)}))
        return 0
    print_table(comparisons)
    ok = [c for c in comparisons if c.ok]
    worst = sorted(ok, key=lambda c: -abs(c.total_error))[: a.worst]
    if len(ok) > a.worst:
        print_table(worst, title=f"{len(worst)} worst rows")
    print(json.dumps(extended_summary(scoreboard(comparisons)) | {"groups": group_summaries(comparisons)}, indent=1))
    print(f"trace {traced_s:.0f} s, estimate + compare {compare_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
