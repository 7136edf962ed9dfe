"""The trace cache of bench/accuracy.py (bench/trace_cache.json): traces keyed by a fingerprint of what the
trace reads from the scenario, stamped with the library versions and a hash of the trace code."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from pathlib import Path

from accuracy_grid import GridRow
from memfit.errors import MemfitError
from memfit.facts.knobs import acting_when, knobs
from memfit.facts.methods import framework_facts, several_models
from memfit.facts.scenario import Scenario

ROOT = Path(__file__).resolve().parent.parent
CACHE_PATH = ROOT / "bench" / "trace_cache.json"
CACHE_SCHEMA = "memfit.trace_cache/1"
TRACE_STEPS = 2  # run_trace default: the second step is the steady state (optimizer states exist)
PAD_TOKENS = 1  # run_trace default: a padded batch carries a mask


# catalog documentation and the scenario's list of assumed defaults: they change no tensor
_DOC_FIELDS = {"aliases", "params_source", "config_source", "published_params", "source", "name", "assumed"}
_OFF = (None, False, 0, "", "none", "off", (), [], {})
# fields added after the cache was written, whose default is what every older entry was traced with
_SAME_AS_BEFORE = {"hidden_act": "silu", "attention_dropout": -1.0}


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
            if f.name in _DOC_FIELDS or _SAME_AS_BEFORE.get(f.name, object()) == value or (value in _OFF and type(value) is type(_field_default(f))
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
                "loss", "micro_batch", "seq_len", "freeze_trainable_layers", "kbit_upcast", "double_quant",
                "virtual_tokens")
# the DPO trace also reads the method, the reference model it builds and its framework's facts
DPO_TRACE_INPUTS = ("method", "ref_model", "precompute_ref_log_probs", "ref_offload")


def _acts(scenario: Scenario, name: str) -> bool:
    when = knobs().get(name).when if name in knobs() else None
    return {"deepspeed": scenario.engine == "deepspeed", "fsdp": scenario.engine == "fsdp",
            "adapters": scenario.uses_adapters, "virtual_tokens": scenario.virtual_tokens_in_use > 0}.get(when, True)


# ModelSpec facts that only the analytic model reads (the trace takes them from transformers' own config
# classes), so adding one does not invalidate the cached traces
ANALYTIC_ONLY_MODEL_FACTS = ("norm_fp32_scale", "attn_softcap", "logit_softcap", "dropout", "eager_repeats_kv",
                             "eager_softmax_in_input_dtype", "eager_qk_fp32", "has_sdpa", "has_flash", "sdpa_v_view")


def fingerprint(scenario: Scenario) -> str:
    doc = {name: _plain(getattr(scenario, name)) for name in TRACE_INPUTS if _acts(scenario, name)}
    if scenario.trainable_tokens:  # only when set: the traces cached before the knob keep their keys
        doc["trainable_tokens"] = scenario.trainable_tokens
    if scenario.tuning == "qlora" and scenario.quant_bits != 4:  # the same: an 8-bit base only
        doc["quant_bits"] = scenario.quant_bits
    if several_models(scenario.method):
        fw = framework_facts(scenario.profile)
        doc |= {name: _plain(getattr(scenario, name)) for name in DPO_TRACE_INPUTS}
        doc["framework"] = {k: fw[k] for k in ("lora_ref", "logits")}
    model = _plain(scenario.model)
    if isinstance(model, dict):
        model = {k: v for k, v in model.items() if k not in ANALYTIC_ONLY_MODEL_FACTS}
        if model.get("position", "rope") != "learned":  # the trace builds positions only for a learned table
            model.pop("max_position_embeddings", None)
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
