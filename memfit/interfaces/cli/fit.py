"""`memfit fit FILE`: read the user's framework file, plan from it, and write the same format back with the
smallest change that reaches the best fitting plan, plus a diff and the reason for each change."""
from __future__ import annotations

import argparse
from pathlib import Path

from memfit.errors import MemfitError
from memfit.facts.knobs import axes
from memfit.interfaces.cli.args import (add_hardware_arguments, blank_arguments, hardware_from_args, positive_int,
                                        scenario_from_args)


def add_fit_command(sub) -> None:
    p = sub.add_parser("fit", help="rewrite a DeepSpeed / LLaMA-Factory / OpenRLHF / accelerate / HF file so the run fits")
    p.add_argument("file", help="the framework file you launch with")
    p.add_argument("--model", help="the model, when the file does not name one")
    add_hardware_arguments(p)
    p.add_argument("--allow", default="", help="tuning changes you accept: lora, qlora, 8bit (comma-separated)")
    p.add_argument("--global-batch", type=positive_int, help="keep this global batch (default: the file's)")
    p.add_argument("--out", default="memfit-fit", help="folder for the rewritten files (default ./memfit-fit)")
    p.add_argument("--in-place", action="store_true", help="overwrite the files themselves")
    p.add_argument("--no-code-edits", action="store_true",
                   help="only plans the file can say (no edit of the framework's code, e.g. OpenRLHF pin_memory)")
    p.add_argument("--no-resume", action="store_true", help="judge host RAM without a resume from a checkpoint")
    p.set_defaults(run=run_fit)


def run_fit(a: argparse.Namespace) -> int:
    from memfit.interfaces.formats import diff, knobs_from_scenario, read_config, write_config_files
    from memfit.planner.plan import Options, choose_for_fit, plan
    from memfit.roles.estimate import estimate
    from memfit.interfaces.render.common import gib

    args = argparse.Namespace(**{**blank_arguments(), "model": a.model, "from_file": a.file, "gpu": a.gpu,
                                 "gpu_mem": a.gpu_mem, "gpus_per_node": a.gpus_per_node, "nodes": a.nodes,
                                 "host_ram": a.host_ram})
    hardware = hardware_from_args(args)
    gpus = hardware.gpus_per_node
    imported = read_config(a.file, gpus=hardware.world_size)
    base = scenario_from_args(args)
    before = estimate(base)
    allow = {x.strip() for x in a.allow.split(",") if x.strip()}
    old = knobs_from_scenario(base)
    writable = {}
    refusals = []
    options = Options(code_edits=not a.no_code_edits, resume=not a.no_resume)
    for row in plan(base, allow, a.global_batch, top_k=10, options=options):
        # knobs the file can say; a code edit is written beside it (_code_edit_text), never into it
        wanted = {k for c in row.changes if not c.code_edit for k in axes()[c.knob]}
        changed = {k: v for k, v in knobs_from_scenario(row.scenario).items() if k in wanted and old.get(k) != v}
        try:  # only plans the user's framework can express (e.g. OpenRLHF has no flag for ratio)
            writable[id(row)] = (row, write_config_files(imported, changed))
        except MemfitError as e:
            refusals.append(str(e))
    best = choose_for_fit([row for row, _ in writable.values()])
    if best is None:
        why = f"; {refusals[0]}" if refusals else " (see `memfit plan`; --allow lora,qlora widens the search)"
        if not refusals and base.hardware.host_ram and options.resume:
            why += "; host RAM is judged at a resume from a checkpoint too (--no-resume if the run never resumes)"
        raise MemfitError(f"no configuration of {base.model.id} that {imported.format} can express fits "
                          f"{gpus} x {base.hardware.gpu.name}{why}")
    files = writable[id(best)][1]
    fastest = max((row for row, _ in writable.values()), key=lambda r: r.tokens_per_second)
    if fastest.tokens_per_second > best.tokens_per_second and any(c.code_edit for c in fastest.changes):
        print(f"(a plan {fastest.tokens_per_second / best.tokens_per_second - 1:.0%} faster needs an edit of "
              f"{imported.format}'s code: see `memfit plan`; written here: the fastest the file can say alone)")
    print(f"{imported.name}: {before.verdict} ({gib(before.device_total.peak.total)} GiB per GPU) -> "
          f"{best.verdict} ({gib(best.device_peak_bytes)} GiB, {best.tokens_per_second:,.0f} tokens/s)")
    for c in best.changes:
        print(f"  {c.knob}: {c.before} -> {c.after}  {_effect(c)}{' (needed to fit)' if c.needed_to_fit else ''}"
              f"{' [CODE EDIT: no flag, see below]' if c.code_edit else ''}")
    print(diff(files) or "(no change to write: the file already fits as planned)")
    for f in files:
        if not f.changed:
            continue
        target = Path(f.path) if a.in_place else Path(a.out) / Path(f.path).name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f.new_text)
        print(f"wrote {target}")
    edits = [c for c in best.changes if c.code_edit]
    if edits:
        text = _code_edit_text(imported, edits)
        target = (Path(imported.path).parent if a.in_place else Path(a.out)) / f"{imported.name}.code-edit.txt"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"\nNEEDS A CODE EDIT as well ({imported.format} has no flag for it):\n{text}wrote {target}")
    return 0


def _effect(c) -> str:
    """A change's effect as signed deltas (memory down is negative, speed up is positive): a saving of
    -12 GiB read as a cost is easy to misread."""
    from memfit.interfaces.render.common import GiB

    host = f", host per node {-c.host_saving_bytes / GiB:+,.2f} GiB" if c.host_saving_bytes else ""
    return f"per GPU {-c.device_saving_bytes / GiB:+,.2f} GiB{host}, speed {-c.speed_cost_pct:+.1f}%"


def _code_edit_text(imported, changes) -> str:
    """The edit of the framework's code the plan needs, as instructions and the exact lines to add (and a
    unified diff when the framework is installed here); the command itself stays a valid command."""

    edit = changes[0].code_edit
    out = [f"# memfit fit: {imported.name} also needs this edit of {imported.format}'s own code: it has no flag for",
           f"# {', '.join(c.knob for c in changes)} ({edit.function}() writes them itself).",
           f"# In {edit.file}, inside {edit.function}(), add just before its `return`:"]
    for c in changes:
        out.append(f"#   {c.knob} {c.before} -> {c.after}: {_effect(c)}")
    lines = [line for c in changes for line in c.code_edit.lines()]
    out += ["    " + line for line in lines]
    patch = _installed_patch(edit.file, edit.function, lines)
    return "\n".join(out) + "\n" + (f"# the same as a patch of the installed copy:\n{patch}" if patch else "")


def _installed_patch(file: str, function: str, lines: list[str]) -> str:
    """A unified diff of the framework's installed file (found without importing it), or ""."""
    import difflib
    import importlib.util

    from memfit.interfaces.formats.openrlhf import edit_function

    package = file.split("/", 1)[0]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return ""
    path = Path(next(iter(spec.submodule_search_locations))).parent / file
    if not path.exists():
        return ""
    old = path.read_text()
    new = edit_function(old, function, lines)
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{file}", f"b/{file}"))
