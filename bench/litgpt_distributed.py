"""`memfit estimate --profile litgpt` on 2 devices vs LitGPT's own several-device finetuning run for real on 2 gloo ranks.

    python bench/litgpt_distributed.py              # table from bench/litgpt_distributed.json (no venv needed)
    python bench/litgpt_distributed.py --remeasure  # run every row again in LitGPT's venv (about 8 minutes on 2 cores)

Each row runs, on 2 CPU ranks with gloo, what litgpt 0.5.13 finetune/{lora,full,adapter,adapter_v2}.py do with
devices > 1 (memfit/measure/litgpt_ranks.py): the script's own Fabric strategy (lora: ModelParallelStrategy with
litgpt's parallelize_fn, FSDP2; the others: FSDPStrategy, FSDP1, every Block checkpointed), bf16-true and bf16-mixed
(the scripts' default; its forward under CUDA's autocast op lists on the CPU), AdamW, three
steps of the script's loop (forward, chunked_cross_entropy, fabric.backward, step, zero_grad) after fit()'s two
validation batches; memfit.measure's tracker counts every storage per rank by category. The model is a small litgpt
Config (Llama layout), given to memfit as the same-shaped ModelSpec; the estimate is memfit's for 2 GPUs under
--profile litgpt, every other knob left to the profile. Compared: the largest per-rank allocated peak of the step's
phases, measured (max over the ranks) vs estimated (without the CUDA-only runtime overhead a CPU run cannot see).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "bench" / "litgpt_distributed.json"
sys.path.insert(0, str(ROOT))

from memfit.facts.catalog import ModelSpec, architectures, find_gpu  # noqa: E402
from memfit.facts.profiles import build_scenario  # noqa: E402
from memfit.facts.scenario import Hardware  # noqa: E402

PHASES = ("forward", "backward", "optimizer_step")
LLAMA = {"block_size": 1024, "rotary_percentage": 1.0, "parallel_residual": False, "bias": False,
         "norm_class_name": "RMSNorm", "mlp_class_name": "LLaMAMLP", "norm_eps": 1e-5}
# litgpt Config shapes: a head-heavy one (the vocabulary outweighs the layers: logits and the root unit dominate) and
# a layer-heavy one (the gathered layers, the sharded gradients and the checkpointed layer's backward show)
SHAPES = {
    "tiny": dict(LLAMA, name="memfit-tiny", n_layer=4, n_head=4, n_query_groups=2, n_embd=256, intermediate_size=768,
                 vocab_size=8000, padded_vocab_size=8000),
    "wide": dict(LLAMA, name="memfit-wide", n_layer=4, n_head=8, n_query_groups=2, n_embd=512, intermediate_size=1536,
                 vocab_size=4096, padded_vocab_size=4096),
}
ROWS = [  # LitGPT runs on 2 devices: finetune script, shape, micro-batch, length
    {"method": "lora", "shape": "tiny", "micro_batch": 2, "seq_len": 256},
    {"method": "full", "shape": "tiny", "micro_batch": 2, "seq_len": 256},
    {"method": "adapter_v2", "shape": "tiny", "micro_batch": 2, "seq_len": 256},
    {"method": "lora", "shape": "wide", "micro_batch": 1, "seq_len": 512},
    {"method": "full", "shape": "wide", "micro_batch": 1, "seq_len": 512},
    {"method": "adapter_v2", "shape": "wide", "micro_batch": 1, "seq_len": 512},
    {"method": "adapter", "shape": "wide", "micro_batch": 1, "seq_len": 512},
    # the scripts' default precision (utils.py get_default_supported_precision(training=True)): an fp32 model, the
    # forward under CUDA's autocast lists (litgpt_ranks.py `_cuda_autocast_on_cpu`); a row without "precision" is
    # bf16-true
    {"method": "lora", "shape": "tiny", "micro_batch": 2, "seq_len": 256, "precision": "bf16-mixed"},
    {"method": "full", "shape": "tiny", "micro_batch": 2, "seq_len": 256, "precision": "bf16-mixed"},
    {"method": "adapter_v2", "shape": "tiny", "micro_batch": 2, "seq_len": 256, "precision": "bf16-mixed"},
    {"method": "lora", "shape": "wide", "micro_batch": 1, "seq_len": 512, "precision": "bf16-mixed"},
    {"method": "full", "shape": "wide", "micro_batch": 1, "seq_len": 512, "precision": "bf16-mixed"},
    {"method": "adapter_v2", "shape": "wide", "micro_batch": 1, "seq_len": 512, "precision": "bf16-mixed"},
    {"method": "adapter", "shape": "wide", "micro_batch": 1, "seq_len": 512, "precision": "bf16-mixed"},
]
TUNING = {"full": "full", "lora": "lora", "adapter": "llama_adapter", "adapter_v2": "llama_adapter_v2"}
PRECISION = {"bf16-true": "bf16-pure", "bf16-mixed": "bf16-mixed"}  # LitGPT --precision -> memfit's (bench/litgpt.py)
STEPS = 3


def run_spec(row: dict) -> dict:
    """What memfit/measure/litgpt_ranks.py runs for a row."""
    return {"method": row["method"], "micro_batch": row["micro_batch"], "seq_len": row["seq_len"], "steps": STEPS,
            "precision": precision(row), "config": SHAPES[row["shape"]]}


def precision(row: dict) -> str:
    return row.get("precision", "bf16-true")


def model_spec(shape: str) -> ModelSpec:
    c = SHAPES[shape]
    family = architectures()["llama"]
    return ModelSpec(id=f"bench/litgpt-{shape}", arch="llama", hidden_size=c["n_embd"], num_layers=c["n_layer"],
                     num_heads=c["n_head"], num_kv_heads=c["n_query_groups"], head_dim=c["n_embd"] // c["n_head"],
                     intermediate_size=c["intermediate_size"], vocab_size=c["padded_vocab_size"],
                     tie_embeddings=False, qkv_bias=False, linear_names=family.get("linear_names", {}),
                     published_params=None)


def scenario(row: dict):
    knobs = {"tuning": TUNING[row["method"]], "micro_batch": row["micro_batch"], "seq_len": row["seq_len"],
             "precision": PRECISION[precision(row)]}
    return build_scenario(model_spec(row["shape"]), Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=2), knobs,
                          "litgpt")


def estimated_peak(row: dict) -> int:
    from memfit.roles.estimate import estimate

    phases = estimate(scenario(row)).allocated.phases
    return max(phases[p].total - phases[p].get("runtime_overhead") for p in PHASES)


def measured_peak(measured: dict) -> int:
    return max(rank["peak"] for rank in measured["ranks"])


def _key(row: dict) -> str:
    return json.dumps(row, sort_keys=True)


def _venv_python() -> Path:
    import importlib.util

    spec = importlib.util.spec_from_file_location("litgpt_bench", ROOT / "bench" / "litgpt.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.venv_python()


def run_rows(rows: list[dict]) -> list[dict]:
    """Each row on 2 gloo ranks in LitGPT's venv: per rank the step's phase peaks by category."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([str(_venv_python()), "-m", "memfit.measure.litgpt_ranks"],
                          input="\n".join(json.dumps(run_spec(r)) for r in rows), capture_output=True, text=True,
                          env=env, cwd=ROOT, check=False)
    if done.returncode:
        raise RuntimeError(f"LitGPT run failed: {done.stderr.strip().splitlines()[-3:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _kept(result: dict) -> dict:
    """What the JSON keeps of a run: per rank its phase breakdowns, backward by layer, peak, parameter counts."""
    ranks = [{k: r[k] for k in ("rank", "phases", "backward_by_layer", "peak", "params", "trainable")}
             for r in result["ranks"]]
    return {"ranks": ranks, "versions": result["ranks"][0]["versions"]}


def measured_rows(remeasure: bool = False) -> dict[str, dict]:
    """bench/litgpt_distributed.json keyed by row; rows missing (all, with remeasure) are run now and saved."""
    doc = json.loads(MEASURED.read_text()) if MEASURED.exists() and not remeasure else {"rows": {}}
    missing = [r for r in ROWS if _key(r) not in doc["rows"]]
    if missing:
        for row, result in zip(missing, run_rows(missing)):
            doc["rows"][_key(row)] = _kept(result)
        versions = {json.dumps(m["versions"], sort_keys=True) for m in doc["rows"].values()}
        doc["versions"] = json.loads(versions.pop()) if len(versions) == 1 else "mixed: remeasure"
        MEASURED.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc["rows"]


def label(row: dict) -> str:
    return f"{row['shape']} {row['method']} mb{row['micro_batch']} T{row['seq_len']} {precision(row)}"


def compare(rows: list[dict], measured: dict[str, dict]) -> list[tuple[dict, int, int, float]]:
    out = []
    for row in rows:
        est, got = estimated_peak(row), measured_peak(measured[_key(row)])
        out.append((row, est, got, 100.0 * (est - got) / got))
    return out


def main(argv: list[str]) -> int:
    measured = measured_rows(remeasure="--remeasure" in argv)
    table = compare(ROWS, measured)
    print(f"{'LitGPT run, 2 ranks':34} {'estimate MiB':>12} {'measured MiB':>12} {'error':>8}")
    for row, est, got, err in table:
        print(f"{label(row):34} {est / 2**20:12.2f} {got / 2**20:12.2f} {err:+7.1f}%")
    errors = [abs(t[3]) for t in table]
    versions = json.loads(MEASURED.read_text())["versions"]
    print(f"median |error| {statistics.median(errors):.1f}%, max |error| {max(errors):.1f}% over {len(table)} rows "
          f"({', '.join(f'{k} {v}' for k, v in sorted(versions.items()))})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
