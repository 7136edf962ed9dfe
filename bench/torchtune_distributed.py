"""`memfit estimate --profile torchtune --gpus 2` vs torchtune's distributed recipes run for real on 2 gloo ranks.

    python bench/torchtune_distributed.py [--rows NAME ...] [--save] [--saved]

Each row runs torchtune 0.6.1's FSDP2 recipe step (memfit/measure/torchtune_recipe.py: full_finetune_distributed.py
/ lora_finetune_distributed.py's model setup, sharding, loss and optimizer) on a small llama3 model built by
torchtune's component builder, on the CPU with 2 gloo ranks, 3 steps; the measured number is the largest per-rank
peak of the steps after the first (every storage counted by memfit/measure/tracker.py, by category). The estimate is
`memfit.roles.estimate` of the same dims through the torchtune profile (it picks FSDP itself: 2 GPUs), its
allocated peak over the step phases without the CUDA runtime overhead a CPU run cannot see.

Runs in torchtune's venv (tests/trace/setup_torchtune_venv.sh); started from another Python it runs itself there.
`--save` keeps the measured rows (with the versions) in bench/torchtune_distributed.json (a run of some rows keeps
the other saved rows measured on the same versions); `--saved` compares them
with the estimate without the venv (bench/framework_paths.py and tests/trace/test_torchtune_distributed.py read them
the same way).
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV = Path(os.environ.get("MEMFIT_TORCHTUNE_VENV", ROOT / ".venvs" / "torchtune"))
SAVED = HERE / "torchtune_distributed.json"
MIB = 2**20
STEP_PHASES = ("forward", "backward", "optimizer_step")
GPUS = 2
STEPS = 3
# a llama3 of bench/engine.py's llama-22m dims (torchtune's llama3 builder: untied output head; "tied" rows: llama3_2's)
DIMS = dict(arch="llama", hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2, intermediate_size=1024,
            vocab_size=16000, max_position_embeddings=2048)
BATCH = {"micro_batch": 2, "seq_len": 256}
ROWS = {  # name -> knobs (the profile fills the rest: bf16, fused AdamW, chunked loss, FSDP on 2 GPUs)
    f"{tuning} reshard={reshard} ckpt={ckpt}": {"tuning": tuning, "checkpointing": ckpt,
                                                "fsdp_strategy": "full_shard" if reshard else "shard_grad_op"}
    for tuning in ("full", "lora") for reshard in (True, False) for ckpt in ("off", "full")
}
ROWS |= {  # the unchunked loss (the model returns fp32 logits), and a tied head (llama3_2's builder: TiedLinear)
    "full reshard=True ckpt=off loss=standard": {"tuning": "full", "checkpointing": "off", "loss": "standard"},
    "full tied reshard=True ckpt=off": {"tuning": "full", "checkpointing": "off", "tied": True},
    "lora tied reshard=True ckpt=off": {"tuning": "lora", "checkpointing": "off", "tied": True},
}
ROWS |= {  # full_finetune_distributed.py's optimizer_in_bwd: True (one AdamW per parameter, stepped in backward)
    f"full reshard=True ckpt={ckpt} optimizer_in_bwd": {"tuning": "full", "checkpointing": ckpt,
                                                       "optimizer_in_backward": True}
    for ckpt in ("off", "full")
}
ROWS |= {  # fsdp_cpu_offload: True (CPUOffloadPolicy: shards, grads and AdamW states in host RAM), both recipes
    f"{tuning} reshard=True ckpt={ckpt} fsdp_cpu_offload": {"tuning": tuning, "checkpointing": ckpt,
                                                           "fsdp_cpu_offload": True}
    for tuning in ("full", "lora") for ckpt in ("off", "full")
}
ROWS["full reshard=True ckpt=off optimizer_in_bwd fsdp_cpu_offload"] = {  # the full recipe takes both together
    "tuning": "full", "checkpointing": "off", "optimizer_in_backward": True, "fsdp_cpu_offload": True}


def spec(tied: bool = False):
    from memfit.facts.catalog import ModelSpec, architectures

    family = architectures()["llama"]
    return ModelSpec(id="bench/llama3-22m" + ("-tied" if tied else ""), head_dim=DIMS["hidden_size"] // DIMS["num_heads"],
                     linear_names=family.get("linear_names", {}), published_params=None, tie_embeddings=tied, **DIMS)


def scenario(knobs: dict):
    """The torchtune-profile Scenario of a row on 2 GPUs. The strategy is given only when it is not the profile's
    own choice (full_shard): the other rows check that the profile picks FSDP by itself."""
    from memfit.facts.catalog import find_gpu
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware

    given = BATCH | {k: v for k, v in knobs.items() if k not in ("fsdp_strategy", "tied")}
    if knobs.get("fsdp_strategy") == "shard_grad_op":
        given["fsdp_strategy"] = knobs["fsdp_strategy"]
    return build_scenario(spec(knobs.get("tied", False)), Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=GPUS),
                          given, "torchtune")


def estimate_row(knobs: dict) -> dict:
    """The estimate's allocated peak over the step phases (no runtime overhead) and its breakdown."""
    from memfit.roles.estimate import estimate

    full = estimate(scenario(knobs))
    est = full.allocated
    phases = {p: est.phases[p] for p in STEP_PHASES}
    peak = max(phases, key=lambda p: phases[p].total - phases[p].get("runtime_overhead"))
    b = phases[peak]
    # the host side per rank (the profile is per node): the offloaded buffers, without the process baseline and
    # the pinned allocator's rounding (runtime overhead a CPU run cannot see)
    host = {p: full.host.phases[p] for p in STEP_PHASES}
    hpeak = max(host, key=lambda p: host[p].total - host[p].get("runtime_overhead"))
    h = host[hpeak]
    return {"estimate": b.total - b.get("runtime_overhead"), "estimate_phase": peak,
            "estimate_parts": {c: v for c, v in b.parts.items() if v and c != "runtime_overhead"},
            "estimate_host": (h.total - h.get("runtime_overhead")) // GPUS,
            "estimate_host_parts": {c: v // GPUS for c, v in h.parts.items() if v and c != "runtime_overhead"}}


def measured_peak(ranks: list[dict]) -> dict:
    """The largest per-rank step peak, its phase and categories; the same of the host side (offloaded shards)."""
    best = max(((r, p) for r in ranks for p in r["phases"]), key=lambda rp: rp[0]["phases"][rp[1]]["total"])
    rank, phase = best
    out = {"measured": rank["phases"][phase]["total"], "measured_phase": phase, "rank": rank["rank"],
           "measured_parts": rank["phases"][phase]["parts"], "measured_host": 0, "measured_host_parts": {}}
    hosts = [(r, p) for r in ranks for p in r.get("host_phases", {})]
    if hosts:
        r, p = max(hosts, key=lambda rp: rp[0]["host_phases"][rp[1]]["total"])
        out |= {"measured_host": r["host_phases"][p]["total"], "measured_host_parts": r["host_phases"][p]["parts"]}
    return out


def compare(name: str, ranks: list[dict]) -> dict:
    row = {"name": name, **measured_peak(ranks), **estimate_row(ROWS[name])}
    row["error_pct"] = 100 * (row["estimate"] - row["measured"]) / row["measured"]
    return row


def saved_rows() -> tuple[list[dict], dict]:
    """The saved measurements compared with today's estimate (no venv needed), and the versions measured on."""
    doc = json.loads(SAVED.read_text())
    return [compare(r["name"], r["ranks"]) for r in doc["rows"] if r["name"] in ROWS], doc["versions"]


def run(names: list[str]) -> dict[str, list[dict]]:
    """Every row in one pair of rank processes (imports and process-group setup once)."""
    work = Path(tempfile.mkdtemp(prefix="memfit-torchtune-"))
    jobs = [{"scenario": scenario(ROWS[n]), "steps": STEPS} for n in names]
    (work / "jobs.pkl").write_bytes(pickle.dumps(jobs))
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(GPUS):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(GPUS), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        log = open(work / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen([sys.executable, "-m", "memfit.measure.torchtune_recipe", str(work / "jobs.pkl"),
                                        str(work)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    for p, log in procs:
        p.wait(timeout=1800)
        log.close()
    out = {}
    for i, n in enumerate(names):
        ranks = []
        for rank in range(GPUS):
            ok, err = work / f"job{i}.rank{rank}.json", work / f"job{i}.rank{rank}.error.json"
            if not ok.exists():
                why = json.loads(err.read_text())["traceback"] if err.exists() else (work / f"rank{rank}.log").read_text()
                raise SystemExit(f"{n}: rank {rank} failed:\n{why[-3000:]}")
            ranks.append(json.loads(ok.read_text()))
        out[n] = ranks
    return out


def table(rows: list[dict]) -> str:
    short = {"weights": "wts", "gradients": "grad", "optimizer_states": "optim", "activations": "act",
             "logits_loss": "logits", "engine_buffers": "buf"}
    lines = [f"{'row':<60}{'measured':>9} {'phase':<9}{'estimate':>9} {'phase':<9}{'err%':>7}  measured / estimate by "
             "category (MiB)"]
    for r in rows:
        m = " ".join(f"{short.get(c, c)}={v / MIB:.1f}" for c, v in r["measured_parts"].items() if v)
        e = " ".join(f"{short.get(c, c)}={v / MIB:.1f}" for c, v in r["estimate_parts"].items() if v)
        lines.append(f"{r['name']:<60}{r['measured'] / MIB:9.2f} {r['measured_phase'][:8]:<9}"
                     f"{r['estimate'] / MIB:9.2f} {r['estimate_phase'][:8]:<9}{r['error_pct']:+7.2f}  {m}  |  {e}")
    errors = [abs(r["error_pct"]) for r in rows]
    lines.append(f"rows {len(rows)}, max |error| {max(errors):.2f}%")
    offloaded = [r for r in rows if ROWS[r["name"]].get("fsdp_cpu_offload")]
    if offloaded:  # the host side per rank (FSDP CPU offload): measured / estimated
        lines.append(f"{'host per rank':<60}{'measured':>9} {'':<9}{'estimate':>9} {'':<9}{'err%':>7}")
        for r in offloaded:
            m = " ".join(f"{short.get(c, c)}={v / MIB:.1f}" for c, v in r["measured_host_parts"].items() if v)
            e = " ".join(f"{short.get(c, c)}={v / MIB:.1f}" for c, v in r["estimate_host_parts"].items() if v)
            err = 100 * (r["estimate_host"] - r["measured_host"]) / r["measured_host"] if r["measured_host"] else 0.0
            lines.append(f"{r['name']:<60}{r['measured_host'] / MIB:9.2f} {'':<9}{r['estimate_host'] / MIB:9.2f} "
                         f"{'':<9}{err:+7.2f}  {m}  |  {e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", choices=sorted(ROWS), help="only these rows (default: all)")
    parser.add_argument("--save", action="store_true", help=f"write the measured rows to {SAVED.name}")
    parser.add_argument("--saved", action="store_true", help=f"compare {SAVED.name} with the estimate (no venv)")
    parser.add_argument("--json", action="store_true", help="print the compared rows as JSON")
    args = parser.parse_args(argv)
    if args.saved:
        rows, versions = saved_rows()
        print(json.dumps(rows) if args.json else table(rows) + f"\nmeasured on {versions}")
        return 0
    try:
        import torchtune  # noqa: F401
    except ImportError:
        python = VENV / "bin" / "python"
        if not python.exists():
            print(f"no torchtune venv at {VENV}: bash tests/trace/setup_torchtune_venv.sh", file=sys.stderr)
            return 2
        os.execv(str(python), [str(python), __file__, *(argv if argv is not None else sys.argv[1:])])
    names = args.rows or list(ROWS)
    started = time.time()
    measured = run(names)
    rows = [compare(n, measured[n]) for n in names]
    if args.json:
        print(json.dumps(rows))
    else:
        print(table(rows))
        print(f"{len(rows)} rows, {GPUS} gloo ranks, {STEPS} steps each, {time.time() - started:.0f} s")
    if args.save:
        _save(measured)
    return 0


def _save(measured: dict[str, list[dict]]) -> None:
    import importlib.metadata as meta

    versions = {name: meta.version(name) for name in ("torchtune", "torchao", "torch")}
    kept = {}
    if SAVED.exists():  # a run of some rows keeps the others' saved measurements (measured on the same versions)
        doc = json.loads(SAVED.read_text())
        if doc.get("versions") == versions:
            kept = {r["name"]: r["ranks"] for r in doc["rows"] if r["name"] in ROWS}
    measured = kept | measured
    rows = [{"name": n, "knobs": BATCH | ROWS[n], "ranks": measured[n]} for n in ROWS if n in measured]
    SAVED.write_text(json.dumps({"schema": "memfit.torchtune_distributed/1", "versions": versions, "dims": DIMS,
                                 "gpus": GPUS, "steps": STEPS, "rows": rows}, indent=1) + "\n")
    print(f"wrote {SAVED}")


if __name__ == "__main__":
    # this file's folder comes first on sys.path when it runs as a script: bench/torchtune.py would shadow torchtune
    sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]
    sys.exit(main())
