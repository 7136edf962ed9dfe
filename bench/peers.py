"""memfit next to the estimators users pick instead, on the same rows.

    python bench/peers.py                   # published cases + a subset of the accuracy grid
    python bench/peers.py --summary-json    # median abs % error per tool
    python bench/peers.py --grid quick|every4|all|none --no-published --json out.json

Rows:
- published: ../shared/cases/published.jsonl, mapped to scenarios by bench/published.py (`scenario_for`,
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

A peer "applies" to full fine-tuning without offload it models; LoRA/QLoRA rows get the peer's number
for the whole model (what a user would read off it) but are marked "n/a" and left out of the
applicable median; the summary also gives the median over every row with a number.
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
import published  # noqa: E402

from memfit.facts.catalog import ModelSpec  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402
from memfit.facts.scenario import Scenario  # noqa: E402

GIB = 2**30
PEERS = ("deepspeed", "accelerate", "llm-analysis")
LLM_ANALYSIS_PYTHON = os.environ.get("MEMFIT_LLM_ANALYSIS_PYTHON", "/tmp/llm-analysis-venv/bin/python")
DEFAULT_CASES = ROOT.parent / "shared" / "cases" / "published.jsonl"


@dataclass
class PeerResult:
    value: int | None  # bytes per GPU, None = the tool cannot answer
    applies: bool
    note: str = ""


@dataclass
class PeerRow:
    id: str
    kind: str  # "published" or "grid"
    truth: float  # bytes: measured (published) or the trace's allocated peak (grid)
    truth_label: str
    memfit: float
    peers: dict[str, PeerResult] = field(default_factory=dict)
    scenario_text: str = ""

    def error(self, value: float | None) -> float | None:
        return None if value is None else 100.0 * (value - self.truth) / self.truth


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


# ---------------------------------------------------------------------------------------------- rows
def _describe(s: Scenario) -> str:
    eng = s.engine if s.engine != "deepspeed" else f"zero{s.zero_stage}"
    return (f"{s.model.id.split('/')[-1]} {s.tuning} {s.precision} {eng}x{s.world_size} {s.attention} "
            f"ckpt={s.checkpointing} b{s.micro_batch}x{s.seq_len}")


def published_rows(path: Path) -> tuple[list[tuple[PeerRow, Scenario]], list[tuple[str, str]]]:
    cases = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows, skipped = [], []
    for case in cases:
        r = published.evaluate(case)
        if r.skip:
            skipped.append((case["id"], r.skip))
            continue
        if r.error_pct is None or case.get("reliability") not in ("high", "medium"):
            continue  # the same numeric set bench/published.py summarizes
        s = published.scenario_for(case)
        rows.append((PeerRow(case["id"], "published", r.measured, f"measured {case.get('basis')}", r.predicted,
                             scenario_text=_describe(s)), s))
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
    return [row for row, _ in pairs]


# ---------------------------------------------------------------------------------------------- output
def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def summary(rows: list[PeerRow]) -> dict:
    out = {}
    for kind in ("published", "grid", "all"):
        chosen = [r for r in rows if kind == "all" or r.kind == kind]
        if not chosen:
            continue
        tools = {"memfit": {"n": len(chosen), "median_abs_pct_error": _median([abs(r.error(r.memfit)) for r in chosen])}}
        for peer in PEERS:
            with_value = [r for r in chosen if r.peers[peer].value is not None]
            applicable = [r for r in with_value if r.peers[peer].applies]
            tools[peer] = {
                "n_applicable": len(applicable),
                "median_abs_pct_error": _median([abs(r.error(r.peers[peer].value)) for r in applicable]),
                "memfit_median_same_rows": _median([abs(r.error(r.memfit)) for r in applicable]),
                "n_with_number": len(with_value),
                "median_abs_pct_error_all_rows": _median([abs(r.error(r.peers[peer].value)) for r in with_value]),
            }
        out[kind] = tools
    return out


def _cell(row: PeerRow, value: float | None, applies: bool = True) -> str:
    if value is None:
        return "—"
    err = row.error(value)
    text = f"{value / GIB:.1f} ({err:+.0f}%)"
    return text if applies else f"[dim]{text} n/a[/]"


LEGEND = (
    "n/a = the tool does not model this row (LoRA/QLoRA: it counts the whole model as trained; offload; fp32 "
    "for llm-analysis); such numbers are shown dim and left out of the applicable median. deepspeed: "
    "estimator/GPUs sharding the states (+opt-off / +param-off = CPU offload), model states only, no "
    "activations. accelerate: the 'Training using Adam' column of the row named (max over its phases of a "
    "batch-1 step, no activations, no sharding; AutoModel without the LM head). llm-analysis: weights + "
    "optimizer states + gradients + activations per GPU by its own parameter count."
)


def print_rows(rows: list[PeerRow], skipped: list[tuple[str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=250)
    for kind, title in (("published", "published cases: GiB per GPU (error vs measured)"),
                        ("grid", "accuracy grid subset: GiB per GPU (error vs the trace's allocated peak)")):
        chosen = [r for r in rows if r.kind == kind]
        if not chosen:
            continue
        table = Table(title=title)
        for col in ("row", *(("scenario",) if kind == "published" else ()), "truth", "memfit", *PEERS,
                    "deepspeed | accelerate | llm-analysis"):
            table.add_column(col, no_wrap=col in ("row", "scenario"), overflow="ellipsis")
        for r in chosen:
            notes = " | ".join(r.peers[p].note for p in PEERS)
            scenario = (r.scenario_text,) if kind == "published" else ()
            table.add_row(r.id, *scenario, f"{r.truth / GIB:.1f}", _cell(r, r.memfit),
                          *[_cell(r, r.peers[p].value, r.peers[p].applies) for p in PEERS], f"[dim]{notes}[/]")
        console.print(table)
    console.print(f"[dim]{LEGEND}[/]")
    if skipped:
        console.print(f"[dim]published cases skipped by bench/published.py ({len(skipped)}): "
                      + "; ".join(sorted({reason for _, reason in skipped})) + "[/]")


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
        Path(a.json).write_text(json.dumps({"summary": result, "rows": [
            {"id": r.id, "kind": r.kind, "scenario": r.scenario_text, "truth": r.truth, "truth_label": r.truth_label,
             "memfit": r.memfit, "memfit_error_pct": r.error(r.memfit),
             "peers": {p: {"value": r.peers[p].value, "error_pct": r.error(r.peers[p].value),
                           "applies": r.peers[p].applies, "note": r.peers[p].note} for p in PEERS}}
            for r in rows], "skipped": skipped}, indent=1))
    if a.summary_json:
        print(json.dumps(result))
        return 0
    print_rows(rows, skipped)
    print(json.dumps(result, indent=1))
    print(f"{len(rows)} rows in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
