"""verl 0.9.1's own FSDP engine on 2 gloo ranks (the actor's update, the reference's log-prob pass) vs memfit.

    python bench/verl_workers.py [--save] [--saved] [--only NAME]

Each row runs memfit/measure/verl_ranks.py in verl's venv (tests/trace/setup_verl_venv.sh) on the engine bench's small
Llama: verl's FSDPEngineWithLMHead built from its own config dataclasses (FSDP1 or FSDP2, full fine-tune), a rollout
batch of 2 rows x 256 tokens without padding, verl's ppo_loss; the allocated peak of each phase of the last step on
one rank. memfit's side is the estimate of the same step on 2 GPUs (memfit/memory/states/verl_fsdp.py: verl's
precision, wrapping and log-prob path; the runtime overhead a CPU run cannot see left out). `--save` keeps the
measured rows, with the versions, in bench/verl_workers.json; `--saved` compares them without running anything.
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

SAVED = HERE / "verl_workers.json"
MIB = 2**20
VENV = Path(os.environ.get("MEMFIT_VERL_VENV", ROOT / ".venvs" / "verl"))
# bench/engine.py's LLAMA (layers and embedding alike); a rollout batch whose logits and activations are small beside
# what the engine holds
DIMS = dict(hidden=384, layers=6, heads=6, kv_heads=2, inter=1024, vocab=16000)
BATCH = dict(micro_batch=2, seq_len=256, steps=2)
ROWS = {f"{role} full {strategy}": dict(role=role, tuning="full", strategy=strategy)
        for strategy in ("fsdp2", "fsdp") for role in ("actor", "ref")}
# LoRA (model.lora_rank 8, verl's target_modules default all-linear): the actor only; verl's reference under LoRA is
# the actor with its adapters disabled (ref_in_actor), no engine of its own
ROWS |= {f"actor lora {strategy}": dict(role="actor", tuning="lora", strategy=strategy) for strategy in ("fsdp2", "fsdp")}
# param_offload + optimizer_offload: verl's own moves run (train_mode() loads shards, gradients and AdamW states back
# before the update, its exit offloads them); on a CPU a move is no copy, so the row shows the update holds the same
ROWS["actor full fsdp2 offload"] = dict(role="actor", tuning="full", strategy="fsdp2", param_offload=True,
                                        optimizer_offload=True)


def _run(name: str) -> dict:
    return {"dims": DIMS, **BATCH, **ROWS[name]}


def measure(names: list[str]) -> dict[str, list[dict]]:
    """name -> the per-rank results of verl's own engine (rank 0 first)."""
    python = VENV / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no verl venv at {VENV}: build it with bash tests/trace/setup_verl_venv.sh")
    lines = "".join(json.dumps(_run(name)) + "\n" for name in names)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([str(python), "-m", "memfit.measure.verl_ranks"], input=lines, text=True,
                          capture_output=True, env=env, timeout=3600)
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    results = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return {name: result["ranks"] for name, result in zip(names, results)}


def scenario(name: str):
    """The row's run as memfit reads it: verl's profile (data/frameworks/verl.toml) on 2 GPUs, with what the CPU run
    changes: SDPA (flash-attn is CUDA-only) and torch's per-tensor AdamW loop (a GPU's AdamW runs foreach)."""
    from engine import tiny
    from memfit.facts.catalog import find_gpu
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware

    row, d = ROWS[name], DIMS
    spec = tiny("llama", "bench/llama-22m", hidden=d["hidden"], layers=d["layers"], heads=d["heads"],
                kv=d["kv_heads"], inter=d["inter"], vocab=d["vocab"])
    knobs = {"tuning": row["tuning"], "micro_batch": BATCH["micro_batch"], "seq_len": BATCH["seq_len"],
             "engine": "fsdp", "fsdp_version": 2 if row["strategy"] == "fsdp2" else 1, "attention": "sdpa",
             "optimizer": "adamw-loop", **({"lora_rank": 8} if row["tuning"] == "lora" else {})}
    return build_scenario(spec, Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=2), knobs, "verl")


def estimate_phases(name: str) -> tuple[dict[str, int], int]:
    """memfit's allocated bytes per phase of the row's step on 2 GPUs (no runtime overhead), and its host bytes;
    the log-probs by the path the CPU run takes (no flash-attn: one log_softmax per token row)."""
    from memfit.memory.states import verl_fsdp

    s = scenario(name)
    if ROWS[name]["role"] == "ref":
        ref = verl_fsdp.reference_pass_bytes(s)
        return {"ref_log_prob": ref["device"]}, ref["host"]
    update = verl_fsdp.actor_update_bytes(s, logprob_path="torch_rows")
    return {"old_log_prob": verl_fsdp.actor_log_prob_bytes(s), **update}, 0


def compare(name: str, ranks: list[dict]) -> dict:
    measured = {phase: max(sum(r["phases"][phase].values()) for r in ranks) for phase in ranks[0]["phases"]}
    est, est_host = estimate_phases(name)
    host = max(max((sum(p.values()) for p in r["host_phases"].values()), default=0) for r in ranks)
    peak_phase = max(measured, key=measured.get)
    est_phase = max(est, key=est.get)
    return {"name": name, "measured": measured[peak_phase], "measured_phase": peak_phase,
            "estimate": est[est_phase], "estimate_phase": est_phase, "phases": measured, "estimate_phases": est,
            "host": host, "estimate_host": est_host,
            "error_pct": 100 * (est[est_phase] - measured[peak_phase]) / measured[peak_phase]}


def saved_rows() -> tuple[list[dict], dict]:
    doc = json.loads(SAVED.read_text())
    return [compare(name, ranks) for name, ranks in doc["rows"].items()], doc["versions"]


def table(rows: list[dict]) -> str:
    w = max([20] + [len(r["name"]) for r in rows])
    out = [f"{'row':<{w}} {'measured':>9} {'phase':<14} {'memfit':>9} {'phase':<14} {'err %':>7} {'host':>7} "
           f"{'memfit':>7}", f"{'':<{w}} {'MiB':>9} {'':<14} {'MiB':>9} {'':<14} {'':>7} {'MiB':>7} {'host':>7}"]
    for r in rows:
        out.append(f"{r['name']:<{w}} {r['measured'] / MIB:9.2f} {r['measured_phase']:<14} {r['estimate'] / MIB:9.2f} "
                   f"{r['estimate_phase']:<14} {r['error_pct']:+7.2f} {r['host'] / MIB:7.2f} "
                   f"{r['estimate_host'] / MIB:7.2f}")
        phases = "  ".join(f"{p} {b / MIB:.2f}/{r['estimate_phases'].get(p, 0) / MIB:.2f}"
                           for p, b in r["phases"].items())
        out.append(f"{'':<{w}}   measured/memfit MiB by phase: {phases}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", action="store_true", help="write the measured rows to verl_workers.json")
    ap.add_argument("--saved", action="store_true", help="compare the saved rows, running nothing")
    ap.add_argument("--only", choices=sorted(ROWS), action="append", help="measure only these rows")
    args = ap.parse_args(argv)
    if args.saved:
        rows, versions = saved_rows()
    else:
        measured = measure(args.only or list(ROWS))
        versions = next(iter(measured.values()))[0]["versions"]
        if args.save:
            old = json.loads(SAVED.read_text())["rows"] if SAVED.exists() and args.only else {}
            SAVED.write_text(json.dumps({"versions": versions, "rows": old | measured}, indent=1) + "\n")
        rows = [compare(name, ranks) for name, ranks in measured.items()]
    print(table(rows))
    print(f"versions: {versions}")
    print("next: python bench/verl_workers.py --save to re-measure, --saved to compare without running")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
