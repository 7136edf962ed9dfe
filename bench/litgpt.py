"""`memfit estimate --profile litgpt` vs LitGPT's own training step traced on fake tensors (memfit/trace/litgpt.py).

    python bench/litgpt.py              # table from bench/litgpt_traces.json (traces missing rows in LitGPT's venv)
    python bench/litgpt.py --retrace    # trace every row again (a few minutes on 2 cores)

Each row is one LitGPT run on one device: a litgpt Config by name, the finetune script (full, lora, adapter, adapter_v2),
micro-batch and length. The trace runs LitGPT's GPT, its loop and its loss through Lightning Fabric (bf16-true) in LitGPT's
own venv (tests/trace/setup_litgpt_venv.sh); the estimate is memfit's for the catalog model of the same name
under --profile litgpt, every other knob left to the profile. Compared: the allocated peak of the step (weights,
gradients, optimizer states, activations, logits/loss), per row and as median / max |error|.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "bench" / "litgpt_traces.json"
SETUP = ROOT / "tests" / "trace" / "setup_litgpt_venv.sh"
sys.path.insert(0, str(ROOT))

from memfit.facts.catalog import find_gpu, find_model  # noqa: E402
from memfit.facts.profiles import build_scenario  # noqa: E402
from memfit.facts.scenario import Hardware  # noqa: E402
from memfit.roles.estimate import estimate  # noqa: E402

COMPARED = ("weights", "gradients", "optimizer_states", "activations", "logits_loss")
PHASES = ("forward", "backward", "optimizer_step")
# litgpt Config name -> memfit catalog id of the same checkpoint
MODELS = {"Llama-3-8B": "meta-llama/Meta-Llama-3-8B", "Mistral-7B-v0.1": "mistralai/Mistral-7B-v0.1",
          "Llama-2-7b-hf": "meta-llama/Llama-2-7b-hf", "Llama-3.2-1B": "meta-llama/Llama-3.2-1B"}
ROWS = [  # LitGPT runs: config, method, micro-batch, length (and n_layer for a short model)
    {"config": "Llama-3-8B", "method": "lora", "micro_batch": 1, "seq_len": 512},
    {"config": "Llama-3-8B", "method": "lora", "micro_batch": 2, "seq_len": 2048},
    {"config": "Mistral-7B-v0.1", "method": "lora", "micro_batch": 4, "seq_len": 1024},
    {"config": "Llama-2-7b-hf", "method": "lora", "micro_batch": 1, "seq_len": 1024},
    {"config": "Llama-3.2-1B", "method": "lora", "micro_batch": 4, "seq_len": 1024},
    {"config": "Llama-3.2-1B", "method": "full", "micro_batch": 1, "seq_len": 1024},
    {"config": "Llama-3.2-1B", "method": "full", "micro_batch": 4, "seq_len": 512},
    {"config": "Llama-3-8B", "method": "full", "micro_batch": 1, "seq_len": 512},
    # LitGPT's own default precision: an fp32 model under autocast (a frozen head is cast once per chunk)
    {"config": "Llama-3.2-1B", "method": "lora", "micro_batch": 2, "seq_len": 512, "precision": "bf16-mixed"},
    {"config": "Mistral-7B-v0.1", "method": "lora", "micro_batch": 1, "seq_len": 1024, "precision": "bf16-mixed"},
    {"config": "Llama-3.2-1B", "method": "full", "micro_batch": 2, "seq_len": 512, "precision": "bf16-mixed"},
    # LLaMA-Adapter v1 / v2 (finetune adapter / adapter_v2)
    {"config": "Llama-3.2-1B", "method": "adapter", "micro_batch": 2, "seq_len": 512},
    {"config": "Llama-3.2-1B", "method": "adapter_v2", "micro_batch": 2, "seq_len": 512},
    {"config": "Llama-3-8B", "method": "adapter", "micro_batch": 1, "seq_len": 1024},
    {"config": "Llama-3-8B", "method": "adapter_v2", "micro_batch": 2, "seq_len": 1024},
    {"config": "Mistral-7B-v0.1", "method": "adapter_v2", "micro_batch": 1, "seq_len": 2048},
    {"config": "Llama-2-7b-hf", "method": "adapter", "micro_batch": 4, "seq_len": 512},
    {"config": "Llama-3.2-1B", "method": "adapter", "micro_batch": 2, "seq_len": 512, "precision": "bf16-mixed"},
    {"config": "Llama-3.2-1B", "method": "adapter_v2", "micro_batch": 2, "seq_len": 512, "precision": "bf16-mixed"},
]
# LitGPT's finetune script -> memfit's --tuning
TUNING = {"full": "full", "lora": "lora", "adapter": "llama_adapter", "adapter_v2": "llama_adapter_v2"}
PRECISION = {"bf16-true": "bf16-pure", "bf16-mixed": "bf16-mixed"}  # LitGPT --precision -> memfit's


def venv_python() -> Path:
    """LitGPT's venv (MEMFIT_LITGPT_VENV or .venvs/litgpt), built by tests/trace/setup_litgpt_venv.sh if absent."""
    venv = Path(os.environ.get("MEMFIT_LITGPT_VENV") or ROOT / ".venvs" / "litgpt")
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run(["bash", str(SETUP)], check=True, cwd=ROOT)
    return python


def trace_runs(runs: list[dict]) -> list[dict]:
    """LitGPT's training step for each run, traced in LitGPT's venv (one process for all)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([str(venv_python()), "-m", "memfit.trace.litgpt"], input="\n".join(map(json.dumps, runs)),
                          capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    if done.returncode:
        raise RuntimeError(f"LitGPT trace failed: {done.stderr.strip().splitlines()[-1:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def scenario(run: dict):
    model = find_model(MODELS[run["config"]])
    if run.get("n_layer"):
        model = replace(model, num_layers=run["n_layer"])
    knobs = {"tuning": TUNING[run["method"]], "micro_batch": run.get("micro_batch", 1), "seq_len": run["seq_len"],
             "precision": PRECISION[run.get("precision", "bf16-true")]}
    hardware = Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=run.get("devices", 1))
    return build_scenario(model, hardware, knobs, "litgpt")


def peak(phases: dict) -> int:
    """The allocated peak over the step's phases, of the compared categories ({phase: {category: bytes}})."""
    return max(sum(phases[p].get(c, 0) for c in COMPARED) for p in PHASES if p in phases)


@dataclass
class Row:
    run: dict
    estimate: int
    trace: int

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.estimate - self.trace) / self.trace

    @property
    def label(self) -> str:
        r = self.run
        layers = f" {r['n_layer']}L" if r.get("n_layer") else ""
        return f"{r['config']}{layers} {r['method']} mb{r.get('micro_batch', 1)} T{r['seq_len']}"


def compare(run: dict, traced: dict) -> Row:
    est = {p: b.parts for p, b in estimate(scenario(run)).allocated.phases.items()}
    return Row(run, peak(est), peak(traced["phases"]))


def _key(run: dict) -> str:
    return json.dumps(run, sort_keys=True)


def cached_traces(runs: list[dict], retrace: bool = False) -> dict[str, dict]:
    """bench/litgpt_traces.json, keyed by run; rows missing (or all, with retrace) are traced now and saved."""
    cache = json.loads(CACHE.read_text()) if CACHE.exists() and not retrace else {"entries": {}}
    missing = [r for r in runs if _key(r) not in cache["entries"]]
    if missing:
        for run, result in zip(missing, trace_runs(missing)):
            cache["entries"][_key(run)] = {k: result[k] for k in ("litgpt", "torch", "phases", "marks", "peak")}
        CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    return cache["entries"]


def main(argv: list[str]) -> int:
    traces = cached_traces(ROWS, retrace="--retrace" in argv)
    rows = [compare(run, traces[_key(run)]) for run in ROWS]
    print(f"{'LitGPT run':40} {'estimate GiB':>12} {'trace GiB':>10} {'error':>8}")
    for row in rows:
        print(f"{row.label:40} {row.estimate / 2**30:12.2f} {row.trace / 2**30:10.2f} {row.error_pct:+7.1f}%")
    errors = [abs(r.error_pct) for r in rows]
    print(f"median |error| {statistics.median(errors):.1f}%, max |error| {max(errors):.1f}% over {len(rows)} rows "
          f"(litgpt {next(iter(traces.values()))['litgpt']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
