"""`memfit estimate --profile torchtune` vs the trace of torchtune's own code (memfit/trace/torchtune.py).

    python bench/torchtune.py [--rows small|all] [--save]

`--save` keeps each row's traced peak in bench/torchtune_traces.json (with the versions it was traced on), which
bench/accuracy.py reads for its framework groups without torchtune's venv.

Runs in torchtune's venv (tests/trace/setup_torchtune_venv.sh); started from another Python it runs itself
there. Each row: the peak allocated bytes of the estimate (without the runtime overhead the trace does not
model) and of the traced recipe step, the peak phase of each, and the error; then median and max |error|.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# this file's folder comes first on sys.path when it runs as a script: its name would shadow the torchtune package
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]
VENV = Path(os.environ.get("MEMFIT_TORCHTUNE_VENV", ROOT / ".venvs" / "torchtune"))
SAVED = HERE / "torchtune_traces.json"

LLAMA_8B, LLAMA_1B, LLAMA2_7B, QWEN = ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.2-1B",
                                       "meta-llama/Llama-2-7b-hf", "Qwen/Qwen2.5-0.5B")
ATTN_MLP = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # llama3_1/8B_lora_single_device
SMALL = [
    (LLAMA_1B, {"tuning": "full", "checkpointing": "off"}),
    (LLAMA_1B, {"tuning": "full", "checkpointing": "full"}),
    (LLAMA_1B, {"tuning": "lora", "checkpointing": "off"}),
    (LLAMA_1B, {"tuning": "lora", "checkpointing": "full"}),
    (LLAMA_1B, {"tuning": "lora", "checkpointing": "full", "loss": "standard"}),
]
LARGE = [
    (LLAMA_8B, {"tuning": "full", "checkpointing": "off"}),
    (LLAMA_8B, {"tuning": "full", "checkpointing": "full"}),
    (LLAMA_8B, {"tuning": "full", "checkpointing": "full", "optimizer_in_backward": True}),
    (LLAMA_8B, {"tuning": "full", "checkpointing": "full", "loss": "standard"}),
    (LLAMA_8B, {"tuning": "lora", "checkpointing": "off", "lora_targets": ATTN_MLP}),
    (LLAMA_8B, {"tuning": "lora", "checkpointing": "full", "lora_targets": ATTN_MLP}),
    (LLAMA2_7B, {"tuning": "full", "checkpointing": "full", "optimizer_in_backward": True}),
    (QWEN, {"tuning": "lora", "checkpointing": "off"}),
    (QWEN, {"tuning": "full", "checkpointing": "full"}),
]
BATCH = {"micro_batch": 2, "seq_len": 2048}
GIB = 2**30


def compare(model: str, knobs: dict) -> dict:
    """One row: the estimate's and the trace's peak (allocated, no runtime overhead) and the error in %."""
    from memfit.roles.estimate import estimate
    from memfit.trace.torchtune import run_torchtune_trace, scenario_of

    s = scenario_of(model, BATCH | knobs)
    est = estimate(s).allocated
    trace = run_torchtune_trace(s)
    predicted = est.peak.total - est.peak.get("runtime_overhead")
    traced = trace.profile.peak.total
    return {"model": model, "knobs": knobs, "estimate": predicted, "trace": traced,
            "estimate_phase": est.peak_phase, "trace_phase": trace.profile.peak_phase,
            "error_pct": 100 * (predicted - traced) / traced, "seconds": trace.seconds,
            "phases": {"trace": trace.profile, "estimate": est}}


def _label(knobs: dict) -> str:
    parts = [knobs["tuning"], f"ckpt={knobs['checkpointing']}"]
    if knobs.get("optimizer_in_backward"):
        parts.append("opt-in-bwd")
    if knobs.get("loss"):
        parts.append(f"loss={knobs['loss']}")
    return " ".join(parts)


def _print_phases(profiles: dict) -> None:
    for phase in ("forward", "backward", "optimizer_step"):
        for source, profile in profiles.items():
            b = profile.phases.get(phase)
            if b is not None:
                parts = ", ".join(f"{c} {v / GIB:.2f}" for c, v in b.parts.items() if v and c != "runtime_overhead")
                print(f"    {phase:15s} {source:9s} {parts}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", choices=("small", "all"), default="all")
    parser.add_argument("--phases", action="store_true", help="also each phase's peak breakdown (GiB)")
    parser.add_argument("--save", action="store_true", help=f"write the traced peaks to {SAVED.name}")
    args = parser.parse_args(argv)
    try:
        import torchtune  # noqa: F401
    except ImportError:
        python = VENV / "bin" / "python"
        if not python.exists():
            print(f"no torchtune venv at {VENV}: bash tests/trace/setup_torchtune_venv.sh", file=sys.stderr)
            return 2
        os.execv(str(python), [str(python), __file__, *(argv if argv is not None else sys.argv[1:])])
    import warnings

    warnings.filterwarnings("ignore")
    rows = SMALL + (LARGE if args.rows == "all" else [])
    print(f"torchtune recipe step: estimate vs trace (batch {BATCH['micro_batch']} x {BATCH['seq_len']}, GiB)")
    errors, saved = [], []
    for model, knobs in rows:
        r = compare(model, knobs)
        errors.append(abs(r["error_pct"]))
        saved.append({"model": model, "knobs": BATCH | knobs, "trace": r["trace"]})
        print(f"{model:26s} {_label(knobs):32s} est {r['estimate'] / GIB:7.2f} ({r['estimate_phase']:8s})  "
              f"trace {r['trace'] / GIB:7.2f} ({r['trace_phase']:8s})  {r['error_pct']:+6.2f}%")
        if args.phases:
            _print_phases(r["phases"])
    print(f"rows {len(errors)}  median |error| {statistics.median(errors):.2f}%  max |error| {max(errors):.2f}%")
    if args.save:
        _save(saved)
    return 0


def _save(rows: list[dict]) -> None:
    import importlib.metadata as meta
    import json

    versions = {name: meta.version(name) for name in ("torchtune", "torchao", "torch")}
    SAVED.write_text(json.dumps({"schema": "memfit.torchtune_traces/1", "versions": versions, "rows": rows},
                                indent=1) + "\n")
    print(f"wrote {SAVED}")


if __name__ == "__main__":
    sys.exit(main())
