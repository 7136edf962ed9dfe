"""`memfit calibrate RUN.jsonl MODEL --gpu ... [knobs] [--save [FILE]]`: the runtime constants (host baseline,
CUDA context, NCCL, allocator slack) that monitored runs on the user's own machine show, measured against
memfit's estimate of those runs, written as a machine profile that `estimate` and `plan` then use.

Presentation only: the measurement is memfit/interfaces/runs/calibrate.py, the profile memfit/interfaces/machine.py.
Registered by main.py::build_parser through `add_calibrate_command(sub)`."""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from memfit.interfaces.cli.args import add_scenario_arguments

SCHEMA = "memfit.calibrate/1"
GIB = 2**30


def add_calibrate_command(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="measure this machine's runtime constants from monitored runs "
                                                "(memfit.monitor) and save them as a machine profile")
    p.add_argument("run_file", metavar="RUN.jsonl", help="the memfit.monitor/1 file of the run (a run of several ranks: "
                                                   "the name given to MemoryMonitor; its RUN.rank*.jsonl are read)")
    add_scenario_arguments(p)
    p.add_argument("--save", nargs="?", const="", metavar="FILE",
                   help="write the machine profile (default: $MEMFIT_MACHINE, else ~/.config/memfit/machine.toml)")
    p.add_argument("--json", action="store_true", help=f"print the {SCHEMA} JSON document")
    p.set_defaults(run=run_calibrate)


def run_calibrate(a: argparse.Namespace) -> int:
    import os

    from memfit.facts.runtime import default_runtime
    from memfit.interfaces.cli.args import scenario_and_file
    from memfit.interfaces.machine import ENV, default_path, render_profile, save_profile
    from memfit.interfaces.runs.calibrate import calibrate
    from memfit.interfaces.runs.read import RunReader
    from memfit.roles.estimate import estimate

    reader = RunReader([a.run_file])
    reader.poll()
    s, _, _ = scenario_and_file(a)
    runtime = default_runtime()  # the run is compared with the defaults: a profile in use would count twice
    s = replace(s, hardware=replace(s.hardware, runtime=runtime))
    c = calibrate(reader.by_rank(), estimate(s), runtime)
    doc = {"schema": SCHEMA, "run": a.run_file, "device_kind": c.device_kind, "ranks": c.ranks, "steps": c.steps,
           "measured": c.values, "evidence": c.evidence, "saved": None}
    if a.save is not None and c.values:
        path = Path(a.save or os.environ.get(ENV) or default_path()).expanduser()
        meta = {"from": a.run_file, "model": s.model.id, "device_kind": c.device_kind, "ranks": c.ranks,
                "steps": c.steps}
        save_profile(path, render_profile(c.values, meta, c.evidence))
        doc["saved"] = str(path)
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        _print(doc, runtime)
    return 0


def _print(doc: dict, runtime) -> None:
    print(f"{doc['ranks']} rank(s), {doc['steps']} steps on {doc['device_kind'] or 'an unknown device'}")
    if not doc["measured"]:
        print("nothing to calibrate: the run's lines have none of host RSS, device used or reserved bytes")
    for name, value in doc["measured"].items():
        before = getattr(runtime, name)
        shown = (f"{value:.1%} (default {before:.0%})" if isinstance(value, float)
                 else f"{value / GIB:.3f} GiB (default {before / GIB:.3f})")
        print(f"  {name}: {shown}\n    {doc['evidence'][name]}")
    if doc["saved"]:
        print(f"saved {doc['saved']}: memfit estimate and plan use it from now on (--machine to choose another)")
    elif doc["measured"]:
        print("not saved (--save writes the machine profile)")
