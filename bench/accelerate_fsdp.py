"""`memfit estimate --profile hf-trainer --fsdp` vs HF Trainer's FSDP path (accelerate's own FSDP1 / FSDP2) on 2 ranks.

    python bench/accelerate_fsdp.py [--save] [--saved]

Each row runs memfit/measure/accelerate_ranks.py on a small Llama (MODELS below: bf16 weights, no autocast, fused
AdamW, checkpointing by transformers' default kwargs, SDPA without a mask): once on 2 gloo ranks through accelerate's
FSDP1 or FSDP2 preparation as the Trainer makes it, once on one process without FSDP. A CPU's SDPA kernel and autocast
are not CUDA's, so the activations of a CPU run are not a GPU's; they are the same in both runs, so the difference of
the two peaks is what FSDP does to the step, and it is compared with the estimate's own difference (2 GPUs under FSDP
minus one GPU, with the row's --fsdp-version). The peak of the 2-rank run is shown beside it.

transformers' TrainingArguments picks FSDP1 up to 5.9 and FSDP2 from 5.10.0 (`fsdp_config.get("version", ...)`, read
from the wheels); an accelerate config says fsdp_version itself (default 1). memfit models each as accelerate lays it
out (memfit/memory/states/accelerate_fsdp.py). The rows named "transformers-4.48" run fms-acceleration's benchmark
releases instead (transformers 4.48.1, accelerate 1.0.1, peft 0.13.2, in the venv of tests/trace/setup_fms_venv.sh;
the runner does that Trainer's FSDP1 path, reentrant checkpointing) against the estimate with
--framework-version transformers=4.48.1. `--save` keeps the measured rows, with the versions, in
bench/accelerate_fsdp.json; `--saved` compares them with the estimate without running anything.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

SAVED = HERE / "accelerate_fsdp.json"
MIB = 2**20
# three small Llamas: the engine bench's (layers and embedding alike), one whose embedding and head outweigh a layer
# four times (what the root / tail units hold shows), one whose layers outweigh the rest (what a layer's gather and
# reduce hold shows); each with the batch that keeps its activations small beside what FSDP holds
MODELS = {
    "llama-22m": (dict(hidden=384, layers=6, heads=6, kv_heads=2, inter=1024, vocab=16000),
                  dict(micro_batch=2, seq_len=256, steps=3)),
    "wide-vocab": (dict(hidden=256, layers=4, heads=4, kv_heads=4, inter=1024, vocab=16384),
                   dict(micro_batch=1, seq_len=16, steps=2)),
    "wide-layer": (dict(hidden=512, layers=4, heads=8, kv_heads=8, inter=4096, vocab=256),
                   dict(micro_batch=1, seq_len=32, steps=2)),
    # eight layers whose inputs outweigh the weights and the loss: what backward keeps per layer shows
    "deep": (dict(hidden=512, layers=8, heads=8, kv_heads=2, inter=1024, vocab=512),
             dict(micro_batch=2, seq_len=512, steps=2)),
}
# fms-acceleration's benchmark environment (scripts/benchmarks/refs/requirements.txt at 24bdadb), the releases its
# A100 rows ran; torch stays memfit's 2.13.0 (its FSDP1 hooks read the same as 2.4.1's, the refs' pin)
FMS_VENV = Path(os.environ.get("MEMFIT_FMS_VENV", ROOT / ".venvs" / "fms"))
FMS_RELEASES = {"transformers": "4.48.1", "accelerate": "1.0.1", "peft": "0.13.2"}
# TrainingArguments' own FSDP1 plugin arguments prefetch nothing in backward; accelerate config files (LLaMA-Factory's
# examples/accelerate/fsdp_config.yaml, fms-acceleration's) write BACKWARD_PRE, which memfit assumes
PREFETCH = {"backward_prefetch": "BACKWARD_PRE"}
ROWS = {
    **{f"{t} fsdp{v}": dict(model="llama-22m", tuning=t, fsdp_version=v) for t in ("full", "lora") for v in (1, 2)},
    **{f"{m} {t} fsdp{v}": dict(model=m, tuning=t, fsdp_version=v, fsdp_config=PREFETCH if v == 1 else {})
       for m in ("wide-vocab", "wide-layer") for t in ("full", "lora") for v in (1, 2)},
    **{f"wide-vocab tied full fsdp{v}": dict(model="wide-vocab", tuning="full", fsdp_version=v, tied=True,
                                             fsdp_config=PREFETCH if v == 1 else {}) for v in (1, 2)},
    # the 4.x Trainer under fms-acceleration's accelerate.yaml (BACKWARD_PRE): LoRA and full, reentrant (4.x's
    # default), and LoRA with use_reentrant=False (gradient_checkpointing_kwargs), which the 4.x Trainer passes through
    **{f"deep {t} fsdp1 transformers-4.48": dict(model="deep", tuning=t, fsdp_version=1, releases=FMS_RELEASES)
       for t in ("full", "lora")},
    "deep lora fsdp1 transformers-4.48 non-reentrant": dict(model="deep", tuning="lora", fsdp_version=1,
                                                            releases=FMS_RELEASES, reentrant=False),
}


def _runs(name: str) -> list[dict]:
    row = ROWS[name]
    dims, batch = MODELS[row["model"]]
    base = {"dims": dims, "checkpointing": True, **batch, "tuning": row["tuning"], "fsdp_version": row["fsdp_version"],
            "fsdp_config": row.get("fsdp_config", {}), "tied": row.get("tied", False),
            **({"reentrant": row["reentrant"]} if "reentrant" in row else {})}
    return [{**base, "world": 2}, {**base, "world": 1}]


def _python(name: str) -> str:
    """The interpreter whose releases a row runs: memfit's own, or the fms venv for the "transformers-4.48" rows."""
    if not ROWS[name].get("releases"):
        return sys.executable
    python = FMS_VENV / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no fms-acceleration venv at {FMS_VENV}: build it with bash tests/trace/setup_fms_venv.sh")
    return str(python)


def _measure_with(python: str, names: list[str]) -> dict[str, dict]:
    lines = "".join(json.dumps(run) + "\n" for name in names for run in _runs(name))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([python, "-m", "memfit.measure.accelerate_ranks"], input=lines, text=True,
                          capture_output=True, env=env, timeout=3600)
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    results = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return {name: {"fsdp": results[2 * i]["ranks"], "single": results[2 * i + 1]["ranks"]}
            for i, name in enumerate(names)}


def measure(names: list[str]) -> dict[str, dict]:
    """name -> {"fsdp": per-rank results, "single": the one process's}, each row run by its releases' python."""
    out: dict[str, dict] = {}
    for python in dict.fromkeys(_python(name) for name in names):
        out |= _measure_with(python, [name for name in names if _python(name) == python])
    return {name: out[name] for name in names}


def estimate_peak(name: str, gpus: int) -> int:
    """The estimate's allocated peak over the step phases, without the runtime overhead a CPU run cannot see."""
    from engine import tiny
    from memfit.facts.catalog import find_gpu
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware
    from memfit.roles.estimate import estimate

    row = ROWS[name]
    d, batch = MODELS[row["model"]]
    spec = tiny("llama", f"bench/{row['model']}", hidden=d["hidden"], layers=d["layers"], heads=d["heads"],
                kv=d["kv_heads"], inter=d["inter"], vocab=d["vocab"], tie=row.get("tied", False))
    knobs = {"tuning": row["tuning"], "lora_rank": 8 if row["tuning"] == "lora" else None, "precision": "bf16-pure",
             "autocast": False, "optimizer": "adamw-fused", "checkpointing": "full", "attention": "sdpa",
             "padding": "packed", "micro_batch": batch["micro_batch"], "seq_len": batch["seq_len"],
             "engine": "fsdp" if gpus > 1 else "single",
             "fsdp_version": row["fsdp_version"] if gpus > 1 else None}
    versions = None
    if row.get("releases"):  # transformers 4.x: reentrant unless the row says not; the runner builds bf16 modules
        versions = {"transformers": row["releases"]["transformers"]}
        knobs |= {"frozen_fp32": False, "reentrant": row.get("reentrant", True)}
    est = estimate(build_scenario(spec, Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=gpus), knobs,
                                  "hf-trainer", versions=versions)).allocated
    return max(est.phases[p].total - est.phases[p].get("runtime_overhead")
               for p in ("forward", "backward", "optimizer_step"))


def compare(name: str, measured: dict) -> dict:
    fsdp = max(r["peak"] for r in measured["fsdp"])
    single = measured["single"][0]["peak"]
    est_fsdp, est_single = estimate_peak(name, 2), estimate_peak(name, 1)
    return {"name": name, "measured": fsdp, "measured_single": single, "estimate": est_fsdp,
            "estimate_single": est_single, "error_pct": 100 * (est_fsdp - fsdp) / fsdp,
            "delta_error_pct": 100 * ((est_fsdp - est_single) - (fsdp - single)) / fsdp}


def table(rows: list[dict]) -> str:
    w = max([28] + [len(r["name"]) for r in rows])
    head = f"{'row':<{w}} {'2 ranks':>9} {'1 rank':>9} {'FSDP -':>9} {'memfit':>9} {'memfit -':>9} {'total':>7} {'FSDP':>7}"
    out = [head, f"{'':<{w}} {'MiB':>9} {'MiB':>9} {'1 rank':>9} {'2 GPUs':>9} {'1 GPU':>9} {'err %':>7} {'err %':>7}"]
    for r in rows:
        out.append(f"{r['name']:<{w}} {r['measured'] / MIB:9.2f} {r['measured_single'] / MIB:9.2f} "
                   f"{(r['measured'] - r['measured_single']) / MIB:9.2f} {r['estimate'] / MIB:9.2f} "
                   f"{(r['estimate'] - r['estimate_single']) / MIB:9.2f} {r['error_pct']:+7.2f} "
                   f"{r['delta_error_pct']:+7.2f}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", action="store_true", help="write the measured rows to accelerate_fsdp.json")
    ap.add_argument("--saved", action="store_true", help="compare the saved rows, running nothing")
    args = ap.parse_args(argv)
    if args.saved:
        measured = json.loads(SAVED.read_text())["rows"]
    else:
        measured = measure(list(ROWS))
        if args.save:
            versions = next(iter(measured.values()))["fsdp"][0]["versions"]
            SAVED.write_text(json.dumps({"versions": versions, "rows": measured}, indent=1) + "\n")
    print(table([compare(name, m) for name, m in measured.items()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
