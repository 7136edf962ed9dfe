"""memfit next to the estimators users pick instead, on the same rows.

    python bench/peers.py                   # published cases + a subset of the accuracy grid
    python bench/peers.py --summary-json    # median abs % error per tool
    python bench/peers.py --grid quick|every4|all|none --no-published --json out.json

Rows:
- published: cases/published.jsonl, mapped to scenarios by bench/published.py (`scenario_for`,
  and its basis logic: memfit's number is its allocated / reserved / device-total peak as the case
  measured it). The peers predict one "memory needed" number and are compared with the measured value
  as it stands.
- grid: rows of bench/accuracy.py whose trace is in bench/trace_cache.json; the truth is the trace's
  allocated peak and memfit's number is the same comparable total bench/accuracy.py uses.

Peers (each run through its own code, offline, from our catalog config):
- deepspeed: `estimate_zero2_model_states_mem_needs` / `estimate_zero3_model_states_mem_needs`, the
  functions whose results `estimate_zero{2,3}_model_states_mem_needs_all_cold` print (deepspeed 0.19.8).
  Parameter counts as `model_to_params` takes them, from the transformers model built on the meta
  device from our config. ZeRO-3 scenarios (and FSDP, its equivalent) use the ZeRO-3 estimator with
  the scenario's offload switches; everything else the ZeRO-2 one (DeepSpeed has no ZeRO-0/1
  estimator, issue #5102), with the GPU count over which the run shards states (1 without ZeRO).
  Model states only: no activations.
- accelerate: `accelerate estimate-memory`'s code path (accelerate 1.15.0): the config's model built as
  `create_empty_model` builds it (`AutoModel`, fp32, `init_empty_weights`), `calculate_maximum_sizes`,
  then `estimate_training_usage` of the row a user reads: "float16" for 16-bit training (the CLI has no
  bfloat16 choice), "float32" for fp32; the tool prints the max over its phases. Batch size 1, no
  activations, one device.
- llm-analysis 0.2.2 (cli99/llm-analysis): `LLMAnalysis.training` from a ModelConfig built from our
  catalog numbers. It pins transformers 4.31, so it runs in its own venv:
      python -m venv /tmp/llm-analysis-venv && /tmp/llm-analysis-venv/bin/pip install llm-analysis==0.2.2
  (or set MEMFIT_LLM_ANALYSIS_PYTHON to another interpreter that has it). Mapping: flash_attn for
  flash and sdpa (CUDA SDPA runs flash / memory-efficient kernels), activation recomputation FULL
  when checkpointing is on, ZeRO stage and dp size from the engine, Adam states; bf16-pure as
  master_weights_dtype_bytes=2 and other_op_bytes=4 (bf16 master, m, v), mixed as its defaults (4, 8).
  We report "(weight+op_state+grad+act)_memory_per_gpu".
- fitcheck: fitcheck-llm 0.3.1 (`pip install -e ".[peers]"`, no torch), its `estimate` on the config.json
  transformers writes for our catalog model, the hub calls of its config reader answered locally
  (bench/peer_fitcheck.py says how, and how each knob maps). One GPU; full, LoRA and QLoRA (nf4); its
  total includes its CUDA-context and fragmentation overhead. It refuses MoE and multimodal configs,
  configs without Llama-style keys and models its parameter formula misses by > 2%: those rows say why.

A peer "applies" to the rows it models: for deepspeed, accelerate and llm-analysis full fine-tuning
(llm-analysis: without offload); for fitcheck one GPU, full/LoRA/QLoRA, a standard loss and full or no
checkpointing. Other rows get the peer's number (what a user would read off it) but are marked "n/a"
and left out of the applicable statistics; the summary also gives the median over every row with a number.

Statistics per tool, each beside memfit's on the same rows: median and p90 of |error|, the share of
rows under-predicted by more than 10% (the error that lets a run OOM), and verdict agreement on the
published cases labelled fits / oom (GPU). A peer's verdict is its own where it gives one (fitcheck:
does_not_fit = oom; safe and uncertain = fits, as memfit's "tight" counts as fits), else its number
against the GPU's memory.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import accuracy  # noqa: E402
import peer_fitcheck  # noqa: E402
import published  # noqa: E402
from shared_cases import PUBLISHED  # noqa: E402

from memfit.facts.catalog import ModelSpec  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402
from memfit.facts.scenario import Scenario  # noqa: E402
from memfit.facts.versions import installed  # noqa: E402

GIB = 2**30
PEERS = ("deepspeed", "accelerate", "llm-analysis", "fitcheck")
LLM_ANALYSIS_PYTHON = os.environ.get("MEMFIT_LLM_ANALYSIS_PYTHON", "/tmp/llm-analysis-venv/bin/python")
DEFAULT_CASES = PUBLISHED


@dataclass
class PeerResult:
    value: int | None  # bytes per GPU, None = the tool cannot answer
    applies: bool
    note: str = ""
    label: str | None = None  # "fits" / "oom": the tool's own verdict, else its number against the GPU


@dataclass
class PeerRow:
    id: str
    kind: str  # "published" or "grid"
    truth: float | None  # bytes: measured (published) or the trace's allocated peak (grid); None = label only
    truth_label: str
    memfit: float | None
    peers: dict[str, PeerResult] = field(default_factory=dict)
    scenario_text: str = ""
    outcome: str | None = None  # the case's fits / oom label
    memfit_label: str | None = None

    def error(self, value: float | None) -> float | None:
        if value is None or self.truth is None:
            return None
        return 100.0 * (value - self.truth) / self.truth


# ---------------------------------------------------------------------------------------------- model facts
@dataclass(frozen=True)
class ModelCounts:
    total_params: int  # DeepSpeed model_to_params: shared parameters once
    largest_layer_params: int  # DeepSpeed model_to_params: the largest module's own parameters
    accelerate_total_bytes: int | None  # calculate_maximum_sizes of the AutoModel in fp32
    note: str = ""


def _quiet():
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


@cache
def model_counts(spec: ModelSpec) -> ModelCounts:
    import warnings

    import torch
    from accelerate import init_empty_weights
    from accelerate.utils import calculate_maximum_sizes
    from transformers import AutoModel, AutoModelForCausalLM

    from memfit.trace.build import hf_config

    _quiet()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            config = hf_config(spec, "eager")  # attention does not change the parameters; every family has eager
        except MemfitError as e:
            from memfit.memory.inventory import count_params

            total = count_params(spec)
            return ModelCounts(total, 0, None, f"no transformers config ({e}); params from memfit's inventory")
        with torch.device("meta"):
            causal = AutoModelForCausalLM.from_config(config)
        total = sum(p.numel() for p in causal.parameters())  # parameters() yields tied weights once
        largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in causal.modules())
        with init_empty_weights():  # accelerate create_empty_model: AutoModel (no LM head) in fp32
            base = AutoModel.from_config(config, dtype=torch.float32)
        acc_total, _ = calculate_maximum_sizes(base)
    return ModelCounts(total, largest, int(acc_total))


# ---------------------------------------------------------------------------------------------- peers
def _sharding(s: Scenario) -> tuple[str, int, bool, bool, bool]:
    """(estimator, GPUs sharding states, optimizer offload, param offload, zero.Init)."""
    if s.engine == "deepspeed":
        opt_off, par_off = s.offload_optimizer != "none", s.offload_param != "none"
        if s.zero_stage == 3:
            return "zero3", s.world_size, opt_off, par_off, s.zero3_init
        return "zero2", s.world_size if s.zero_stage >= 1 else 1, opt_off, False, False
    if s.engine == "fsdp" and s.fsdp_strategy != "no_shard":
        off = s.fsdp_cpu_offload
        return "zero3", s.world_size, off, off, True
    return "zero2", 1, False, False, False


def deepspeed_peer(s: Scenario, counts: ModelCounts) -> PeerResult:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    which, gpus, opt_off, par_off, zero_init = _sharding(s)
    nodes = s.hardware.nodes
    per_node = max(1, gpus // nodes)
    if which == "zero3":
        _, gpu, _ = estimate_zero3_model_states_mem_needs(
            counts.total_params, counts.largest_layer_params, num_gpus_per_node=per_node, num_nodes=nodes,
            cpu_offload=opt_off, cpu_offload_params=par_off, zero_init=zero_init)
    else:
        _, gpu = estimate_zero2_model_states_mem_needs(counts.total_params, num_gpus_per_node=per_node,
                                                       num_nodes=nodes if gpus > 1 else 1, cpu_offload=opt_off)
    notes = [f"{which}/{gpus}gpu{'+opt-off' if opt_off else ''}{'+param-off' if par_off else ''}"]
    applies = s.tuning == "full"
    if not applies:
        notes.insert(0, f"n/a {s.tuning}")
    if s.zero_stage == 1:
        notes.append("zero1 as zero2")
    return PeerResult(int(gpu), applies, "; ".join(notes))


def accelerate_peer(s: Scenario, counts: ModelCounts) -> PeerResult:
    from accelerate.commands.estimate import estimate_training_usage

    if counts.accelerate_total_bytes is None:
        return PeerResult(None, False, "n/a: " + counts.note)
    dtype = "float32" if s.precision == "fp32" else "float16"
    usage = estimate_training_usage(counts.accelerate_total_bytes, dtype)
    value = max(usage.values())
    applies = s.tuning == "full"
    notes = [f"{dtype} row"]
    if not applies:
        notes.insert(0, f"n/a {s.tuning}")
    return PeerResult(int(value), applies, " ".join(notes))


def llm_analysis_request(s: Scenario) -> dict:
    m = s.model
    which, gpus, opt_off, par_off, _ = _sharding(s)
    stage = s.zero_stage if s.engine == "deepspeed" else (3 if which == "zero3" else 0)
    ffn = m.moe_intermediate_size if m.is_moe and m.moe_intermediate_size else m.intermediate_size
    ffn = ffn or 4 * m.hidden_size
    pure = s.precision.endswith("-pure")
    fp32 = s.precision == "fp32"
    return {
        "model": {"name": m.id, "num_layers": m.num_layers, "n_head": m.num_heads, "hidden_dim": m.hidden_size,
                  "vocab_size": m.vocab_size, "num_key_value_heads": m.num_kv_heads, "ffn_embed_dim": ffn,
                  # both given, so its ffn % hidden assertion does not fire (Llama 14336 / 4096 = 3.5)
                  "expansion_ratio": ffn / m.hidden_size, "max_seq_len": max(s.seq_len, m.max_position_embeddings),
                  "moe_num_experts": max(1, m.num_experts), "moe_top_k": max(1, m.experts_per_token)},
        "bits": 32 if fp32 else 16,  # llm-analysis asserts 4/8/16: fp32 rows are reported n/a
        "train": {"batch_size_per_gpu": s.micro_batch, "gradient_accumulation_steps": s.grad_accum,
                  "seq_len": s.seq_len, "activation_recomputation": 2 if s.checkpointing != "off" else 0,
                  "ds_zero": stage, "flash_attn": s.attention in ("flash", "sdpa"),
                  "master_weights_dtype_bytes": 2 if pure else 4, "other_op_bytes": 4 if pure else 8,
                  "mlp_gated_linear_units": m.mlp == "gated"},
        "dp_size": gpus if stage else 1,
        "offload": opt_off or par_off,
    }


# Runs inside the llm-analysis venv: JSON requests on stdin, one result per request on stdout.
_LLM_ANALYSIS_RUNNER = r"""
import json, logging, sys
from llm_analysis.analysis import LLMAnalysis, ActivationRecomputation, DSZeRO
from llm_analysis.config import ModelConfig, GPUConfig, DtypeConfig, ParallelismConfig
from llm_analysis.logger import logger
logger.setLevel(logging.ERROR)
# memory does not enter the estimate; a huge card keeps the tool from warning about fit
gpu = GPUConfig(name="any", mem_per_GPU_in_GB=1e6, hbm_bandwidth_in_GB_per_sec=2039,
                intra_node_bandwidth_in_GB_per_sec=300, intra_node_min_message_latency=8e-06,
                peak_fp16_TFLOPS=312)
out = []
for req in json.load(sys.stdin):
    if req["bits"] == 32:
        out.append({"error": "fp32"})
        continue
    try:
        b = req["bits"]
        a = LLMAnalysis(ModelConfig(**req["model"]), gpu, DtypeConfig(name=f"w{b}a{b}e{b}", weight_bits=b,
                        activation_bits=b, embedding_bits=b), ParallelismConfig(dp_size=req["dp_size"]))
        t = dict(req["train"])
        t["activation_recomputation"] = ActivationRecomputation(t["activation_recomputation"])
        t["ds_zero"] = DSZeRO(t["ds_zero"])
        r = a.training(**t)
        out.append({k: r[k] for k in ("(weight+op_state+grad+act)_memory_per_gpu", "weight_memory_per_gpu",
                                      "gradient_memory_per_gpu", "optimizer_state_memory_per_gpu",
                                      "activation_memory_per_gpu", "num_params_total")})
    except Exception as e:
        out.append({"error": f"{type(e).__name__}: {e}"})
json.dump(out, sys.stdout)
"""


def run_llm_analysis(requests: list[dict]) -> list[dict] | str:
    """Results in request order, or a string saying why the tool could not run."""
    if not Path(LLM_ANALYSIS_PYTHON).exists():
        return f"not installed ({LLM_ANALYSIS_PYTHON} missing; see bench/peers.py docstring)"
    proc = subprocess.run([LLM_ANALYSIS_PYTHON, "-c", _LLM_ANALYSIS_RUNNER], input=json.dumps(requests),
                          capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        return f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
    return json.loads(proc.stdout)


def llm_analysis_peer(s: Scenario, req: dict, result: dict | str) -> PeerResult:
    if isinstance(result, str):
        return PeerResult(None, False, result)
    if req["bits"] == 32:
        return PeerResult(None, False, "n/a fp32 (dtype configs stop at 16 bits)")
    if "error" in result:
        return PeerResult(None, False, result["error"][:90])
    notes = []
    applies = s.tuning == "full" and not req["offload"]
    if s.tuning != "full":
        notes.append(f"n/a {s.tuning}")
    if req["offload"]:
        notes.append("n/a offload")
    notes.append(f"{result['num_params_total'] / 1e9:.2f}B params")
    return PeerResult(int(result["(weight+op_state+grad+act)_memory_per_gpu"]), applies, " ".join(notes))


def fitcheck_peer(s: Scenario, counts: ModelCounts) -> PeerResult:
    # the hub's safetensors count, which fitcheck checks its formula against: the transformers model's own
    a = peer_fitcheck.fitcheck_answer(s, counts.total_params)
    return PeerResult(a.value, a.applies, a.note, a.label)


# ---------------------------------------------------------------------------------------------- rows
def _describe(s: Scenario) -> str:
    eng = s.engine if s.engine != "deepspeed" else f"zero{s.zero_stage}"
    return (f"{s.model.id.split('/')[-1]} {s.tuning} {s.precision} {eng}x{s.world_size} {s.attention} "
            f"ckpt={s.checkpointing} b{s.micro_batch}x{s.seq_len}")


def _gpu_outcome(case: dict) -> str | None:
    """The case's fits / oom label (a fit at the boundary fits); host-RAM outcomes are not a GPU verdict."""
    outcome = {"fits_at_max": "fits"}.get(case.get("outcome"), case.get("outcome"))
    return outcome if outcome in ("fits", "oom") else None


def published_rows(path: Path) -> tuple[list[tuple[PeerRow, Scenario]], list[tuple[str, str]]]:
    rows, skipped = [], []
    for raw in published.read_cases(path):  # any shape the case schema allows; a bad row is skipped, with why
        r = published.evaluate(raw)
        case = r.case  # normalized: every key this reads in one shape
        if r.skip:
            skipped.append((case["id"], r.skip))
            continue
        # the same numeric set and labels bench/published.py summarizes
        numeric = r.error_pct is not None and case.get("reliability") in ("high", "medium")
        outcome = _gpu_outcome(case) if r.label_ok is not None else None
        if not numeric and outcome is None:
            continue
        s = published.scenario_for(case)
        rows.append((PeerRow(case["id"], "published", r.measured if numeric else None, f"measured {case.get('basis')}",
                             r.predicted if numeric else None, scenario_text=_describe(s), outcome=outcome,
                             memfit_label=r.predicted_label), s))
    return rows, skipped


def grid_rows(which: str) -> list[tuple[PeerRow, Scenario]]:
    if which == "none":
        return []
    rows = {"quick": accuracy.quick_grid(), "all": accuracy.grid(), "every4": accuracy.grid()[::4]}[which]
    out = []
    for c in accuracy.evaluate(rows, accuracy.TraceCache()):
        if c.ok:
            out.append((PeerRow(c.row.id, "grid", c.trace_total, "trace allocated", c.est_total,
                                scenario_text=c.row.id), c.row.scenario()))
    return out


def run_peers(pairs: list[tuple[PeerRow, Scenario]]) -> list[PeerRow]:
    import warnings

    requests = [llm_analysis_request(s) for _, s in pairs]
    la_results = run_llm_analysis(requests) if requests else []
    for i, (row, s) in enumerate(pairs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            counts = model_counts(s.model)
        row.peers["deepspeed"] = deepspeed_peer(s, counts)
        row.peers["accelerate"] = accelerate_peer(s, counts)
        row.peers["llm-analysis"] = llm_analysis_peer(
            s, requests[i], la_results if isinstance(la_results, str) else la_results[i])
        row.peers["fitcheck"] = fitcheck_peer(s, counts)
        for result in row.peers.values():
            if result.label is None and result.value is not None:  # no verdict of its own: its number vs the card
                result.label = "oom" if result.value > s.hardware.gpu.memory_bytes else "fits"
    return [row for row, _ in pairs]


# ---------------------------------------------------------------------------------------------- output
def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def error_stats(errors: list[float]) -> dict:
    """median and p90 of |error| (p90 as bench/published.py takes it), and the share under-predicted by > 10%."""
    if not errors:
        return {"median_abs_pct_error": None, "p90_abs_pct_error": None, "under_10pct_share": None}
    magnitudes = sorted(abs(e) for e in errors)
    return {"median_abs_pct_error": _median(magnitudes),
            "p90_abs_pct_error": round(magnitudes[min(len(magnitudes) - 1, int(0.9 * len(magnitudes)))], 1),
            "under_10pct_share": round(sum(e < -10 for e in errors) / len(errors), 3)}


def _agreement(labels: list[tuple[str | None, str]]) -> float | None:
    """Share of (predicted, outcome) pairs that agree; a row without a verdict counts as wrong."""
    return round(sum(p == o for p, o in labels) / len(labels), 3) if labels else None


def _memfit_summary(chosen: list[PeerRow]) -> dict:
    numeric = [r for r in chosen if r.truth is not None]
    labelled = [r for r in chosen if r.outcome]
    return {"n": len(numeric), **error_stats([r.error(r.memfit) for r in numeric]),
            "n_labels": len(labelled), "label_agreement": _agreement([(r.memfit_label, r.outcome) for r in labelled])}


def _peer_summary(chosen: list[PeerRow], peer: str) -> dict:
    numeric = [r for r in chosen if r.truth is not None]
    with_value = [r for r in numeric if r.peers[peer].value is not None]
    applicable = [r for r in with_value if r.peers[peer].applies]
    labelled = [r for r in chosen if r.outcome and r.peers[peer].applies]
    return {
        "n_applicable": len(applicable),
        **error_stats([r.error(r.peers[peer].value) for r in applicable]),
        "memfit_same_rows": error_stats([r.error(r.memfit) for r in applicable]),
        "n_with_number": len(with_value),
        "median_abs_pct_error_all_rows": _median([abs(r.error(r.peers[peer].value)) for r in with_value]),
        "n_labels_applicable": len(labelled),
        "label_agreement": _agreement([(r.peers[peer].label, r.outcome) for r in labelled]),
        "memfit_label_agreement_same_rows": _agreement([(r.memfit_label, r.outcome) for r in labelled]),
    }


def summary(rows: list[PeerRow]) -> dict:
    out = {}
    for kind in ("published", "grid", "all"):
        chosen = [r for r in rows if kind == "all" or r.kind == kind]
        if chosen:
            out[kind] = {"memfit": _memfit_summary(chosen), **{p: _peer_summary(chosen, p) for p in PEERS}}
    return out


def _cell(row: PeerRow, value: float | None, applies: bool = True) -> str:
    if value is None:
        return "—"
    err = row.error(value)
    text = f"{value / GIB:.1f} ({err:+.0f}%)"
    return text if applies else f"[dim]{text} n/a[/]"


LEGEND = (
    "n/a = the tool does not model this row (deepspeed, accelerate, llm-analysis: LoRA/QLoRA, where they count "
    "the whole model as trained; offload and fp32 for llm-analysis; fitcheck: several GPUs, fused or chunked "
    "losses, DoRA, offloaded checkpoints, a GPTQ base); such numbers are shown dim and left out of the "
    "applicable statistics. deepspeed: estimator/GPUs sharding the states (+opt-off / +param-off = CPU "
    "offload), model states only, no activations. accelerate: the 'Training using Adam' column of the row "
    "named (max over its phases of a batch-1 step, no activations, no sharding; AutoModel without the LM "
    "head). llm-analysis: weights + optimizer states + gradients + activations per GPU by its own parameter "
    "count. fitcheck: its total (with its overhead) for one GPU, its verdict and the largest micro-batch it fits."
)


def _numeric_table(rows: list[PeerRow], kind: str, title: str):
    from rich.table import Table

    table = Table(title=title)
    for col in ("row", *(("scenario",) if kind == "published" else ()), "truth", "memfit", *PEERS, " | ".join(PEERS)):
        table.add_column(col, no_wrap=col in ("row", "scenario"), overflow="ellipsis")
    for r in rows:
        notes = " | ".join(r.peers[p].note for p in PEERS)
        scenario = (r.scenario_text,) if kind == "published" else ()
        table.add_row(r.id, *scenario, f"{r.truth / GIB:.1f}", _cell(r, r.memfit),
                      *[_cell(r, r.peers[p].value, r.peers[p].applies) for p in PEERS], f"[dim]{notes}[/]")
    return table


def _verdict(label: str | None, outcome: str, applies: bool = True) -> str:
    if label is None:
        return "—"
    text = label if label == outcome else f"[red]{label}[/]"
    return text if applies else f"[dim]{text} n/a[/]"


def _label_table(rows: list[PeerRow]):
    """The labelled cases without a measured number (mostly OOM reports): otherwise seen only in the summary."""
    from rich.table import Table

    table = Table(title="published fits/OOM cases without a number: each tool's verdict (red = wrong)")
    for col in ("row", "scenario", "outcome", "memfit", *PEERS):
        table.add_column(col, no_wrap=col in ("row", "scenario"), overflow="ellipsis")
    for r in rows:
        table.add_row(r.id, r.scenario_text, r.outcome, _verdict(r.memfit_label, r.outcome),
                      *[_verdict(r.peers[p].label, r.outcome, r.peers[p].applies) for p in PEERS])
    return table


def _stats_text(stats: dict) -> str:
    if stats["median_abs_pct_error"] is None:
        return "—"
    return (f"{stats['median_abs_pct_error']:.1f} / {stats['p90_abs_pct_error']:.0f} / "
            f"{100 * stats['under_10pct_share']:.0f}%")


def _share(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def _summary_table(result: dict):
    from rich.table import Table

    table = Table(title="summary: |error| median / p90 / share under-predicted by > 10%, on each tool's "
                        "applicable rows, memfit on the same rows; verdict agreement on labelled cases")
    for col in ("rows", "tool", "n", "tool error", "memfit error", "n labels", "tool verdicts", "memfit verdicts"):
        table.add_column(col)
    for kind, tools in result.items():
        m = tools["memfit"]
        table.add_row(kind, "memfit (all rows)", str(m["n"]), _stats_text(m), "", str(m["n_labels"]),
                      _share(m["label_agreement"]), "")
        for peer in PEERS:
            t = tools[peer]
            table.add_row("", peer, str(t["n_applicable"]), _stats_text(t), _stats_text(t["memfit_same_rows"]),
                          str(t["n_labels_applicable"]), _share(t["label_agreement"]),
                          _share(t["memfit_label_agreement_same_rows"]))
    return table


def print_rows(rows: list[PeerRow], skipped: list[tuple[str, str]], result: dict) -> None:
    from rich.console import Console

    console = Console(width=250)
    for kind, title in (("published", "published cases: GiB per GPU (error vs measured)"),
                        ("grid", "accuracy grid subset: GiB per GPU (error vs the trace's allocated peak)")):
        chosen = [r for r in rows if r.kind == kind and r.truth is not None]
        if chosen:
            console.print(_numeric_table(chosen, kind, title))
    label_only = [r for r in rows if r.truth is None and r.outcome]
    if label_only:
        console.print(_label_table(label_only))
    console.print(f"[dim]{LEGEND}[/]")
    if skipped:
        console.print(f"[dim]published cases skipped by bench/published.py ({len(skipped)}): "
                      + "; ".join(sorted({reason for _, reason in skipped})) + "[/]")
    console.print(_summary_table(result))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=str(DEFAULT_CASES))
    p.add_argument("--no-published", action="store_true")
    p.add_argument("--grid", default="every4", choices=("none", "quick", "every4", "all"),
                   help="which accuracy-grid rows (only rows with a cached trace)")
    p.add_argument("--summary-json", action="store_true")
    p.add_argument("--json", help="write every row (numbers and notes) to this file")
    a = p.parse_args(argv)
    started = time.perf_counter()
    pairs, skipped = ([], []) if a.no_published else published_rows(Path(a.cases))
    pairs += grid_rows(a.grid)
    # DeepSpeed's logger prints an accelerator banner on stdout when first imported (here): keep it out
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        rows = run_peers(pairs)
    result = summary(rows)
    if a.json:
        Path(a.json).write_text(json.dumps({"summary": result, "versions": installed(), "rows": [
            {"id": r.id, "kind": r.kind, "scenario": r.scenario_text, "truth": r.truth, "truth_label": r.truth_label,
             "memfit": r.memfit, "memfit_error_pct": r.error(r.memfit), "outcome": r.outcome,
             "memfit_label": r.memfit_label,
             "peers": {p: {"value": r.peers[p].value, "error_pct": r.error(r.peers[p].value),
                           "applies": r.peers[p].applies, "note": r.peers[p].note, "label": r.peers[p].label}
                       for p in PEERS}}
            for r in rows], "skipped": skipped}, indent=1))
    if a.summary_json:
        print(json.dumps(result | {"versions": installed()}))
        return 0
    print_rows(rows, skipped, result)
    print(f"{len(rows)} rows in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
