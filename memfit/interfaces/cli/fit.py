"""`memfit fit FILE`: read the user's framework file, plan from it, and write the same format back with the
smallest change that reaches the best fitting plan, plus a diff and the reason for each change."""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from memfit.errors import MemfitError
from memfit.facts.knobs import axes
from memfit.interfaces.cli.args import add_hardware_arguments, blank_arguments, positive_int, scenario_and_file
from memfit.interfaces.files import UNCHECKED, FileWrite, write_files

ROLES = ("ref", "reward", "critic")  # several-model runs: a role's model may be given instead of the file's


def add_fit_command(sub) -> None:
    p = sub.add_parser("fit", help="rewrite a DeepSpeed / LLaMA-Factory / OpenRLHF / accelerate / HF file so the run fits")
    p.add_argument("file", nargs="?", help="the framework file you launch with, or the launch script / command "
                                           "line (every file it uses is rewritten, as one set)")
    p.add_argument("--from", dest="from_files", action="append", metavar="FILE",
                   help="instead of FILE: several files of one run (repeat --from), written as one set")
    p.add_argument("--model", help="the model, when the file does not name one")
    for role in ROLES:  # DPO / PPO / GRPO: a model the file names that the catalog and the HF cache lack
        p.add_argument(f"--{role}-model", help=f"the {role} model of a several-model run, instead of the file's")
    add_hardware_arguments(p)
    p.add_argument("--allow", default="",
                   help="changes of the training you accept (comma-separated): lora, qlora (tuning), 8bit (8-bit "
                        "optimizer states), packing (pack or unpad rows: other data per step). Without them fit keeps "
                        "the tuning, the optimizer and the data of each step; it never changes the global batch "
                        "(micro-batch x accumulation x GPUs; see --global-batch) or the sequence length")
    p.add_argument("--global-batch", type=positive_int, help="keep this global batch (default: the file's)")
    p.add_argument("--row", type=positive_int, metavar="N",
                   help="write plan N of those `memfit plan --from FILE` shows (same machine, --allow and "
                        "--global-batch), or say which key the file lacks for it; default: the fastest the file can say")
    p.add_argument("--out", default="memfit-fit", help="folder for the rewritten files (default ./memfit-fit; "
                                                        "a launch's files keep their layout under it)")
    p.add_argument("--in-place", action="store_true",
                   help="overwrite the files themselves (all or none, atomically); each original is kept as "
                        "NAME.memfit-bak, or NAME.memfit-bak.1, .2, ... when that exists: a backup is never overwritten")
    p.add_argument("--no-code-edits", action="store_true",
                   help="only plans the file can say (no edit of the framework's code, e.g. OpenRLHF pin_memory)")
    p.add_argument("--no-resume", action="store_true", help="judge host RAM without a resume from a checkpoint")
    from memfit.interfaces.cli.fit_asked import add_asked_arguments

    add_asked_arguments(p)  # --attn sdpa, --precision fp16-mixed, ...: written into the file
    p.set_defaults(run=run_fit)


# the rewritten run, read back, must land within this share of the GPU of the plan's device peak
AGREE = 0.02


def run_fit(a: argparse.Namespace) -> int:
    from memfit.interfaces.cli.fit_asked import asked_knobs, check_sayable, file_values
    from memfit.interfaces.cli.fit_files import fit_files
    from memfit.interfaces.formats import diff, knobs_from_scenario
    from memfit.interfaces.render.common import gib
    from memfit.planner.plan import Options, baseline
    from memfit.planner.search import fit_allow

    if bool(a.file) == bool(a.from_files):
        raise MemfitError("memfit fit takes one FILE or --from FILE (repeated), not both and not neither")
    asked = asked_knobs(a)
    args = argparse.Namespace(**{**blank_arguments(), **{k: getattr(a, k) for k in asked}, "model": a.model, "profile": a.profile,
                                 "from_file": a.from_files or a.file,
                                 **{f"{role}_model": getattr(a, f"{role}_model") for role in ROLES},
                                 "gpu": a.gpu,
                                 "gpu_mem": a.gpu_mem, "gpus_per_node": a.gpus_per_node, "nodes": a.nodes,
                                 "host_ram": a.host_ram})
    base, imported, notes = scenario_and_file(args)
    if base.unread:  # no plan of a run memfit does not read whole is "fits" (planner/search.py judge)
        raise MemfitError(f"not read: {base.unread[0]}"  # the line names the file
                          + (f" (and {len(base.unread) - 1} more)" if len(base.unread) > 1 else "")
                          + "; memfit fit rewrites only a run it reads whole: state the setting in a form memfit "
                          "reads or take it out (memfit estimate --from shows the estimate without it)")
    allow, kept = fit_allow(a.allow.split(","))
    options = Options(code_edits=not a.no_code_edits, resume=not a.no_resume)
    folder = None if a.in_place else Path(a.out)
    now = baseline(base, a.global_batch, options)
    if not a.row and not asked and now.verdict == "fits" and a.global_batch in (None, base.micro_batch * base.grad_accum * base.world_size):
        print(f"{imported.name}: fits ({gib(now.device_peak_bytes)} of {gib(base.hardware.gpu.memory_bytes)} GiB "
              f"per GPU): nothing to change, nothing written")
        _print_notes(notes, base)
        print(f"next: launch it as it is; faster plans that fit: memfit plan {_machine_words(a)} --from "
              + " --from ".join(map(shlex.quote, a.from_files or [a.file])))
        return 0
    old = knobs_from_scenario(base) | file_values(imported, asked)  # an asked setting is a change to write
    io = fit_files(imported, a.from_files or [a.file], base.hardware.world_size, folder)
    check_sayable(asked, io.said, imported)
    said = io.said
    refusals: dict[str, str] = {}

    def says(scenario, edited) -> bool:
        """Can the user's files say this scenario (what a code edit reaches goes beside it)?"""
        changed = _changes_of(scenario, old, said, {k for axis in edited for k in axes()[axis]})
        try:
            io.write(changed)
        except MemfitError as e:
            refusals.setdefault(str(e), str(e))
            return False
        return True

    given = {f"{r}_model": getattr(a, f"{r}_model") for r in ROLES if getattr(a, f"{r}_model")}  # not the file's

    def keeps_the_step(files, row) -> None:
        """The files as written train on the plan's data per step (a writer that drops the accumulation it cannot
        hold, accelerate's deepspeed_config leaving for FSDP, would change the global batch): else refused."""
        run = _written_run(imported, io.reread(files), row, given)
        if a.row:  # the plan shown, exactly: a key the format lacks reads back as another value
            _same_knobs(imported, run, row.scenario)
        written, planned = _step_of(run), _step_of(row.scenario)
        if written != planned:
            raise MemfitError(f"{imported.name}: rewritten for this plan, the files would train on {written[0]} rows "
                              f"per step ({written[1]}, {written[2]} tokens), not the plan's {planned[0]} "
                              f"({planned[1]}, {planned[2]}): they cannot hold one of its settings")

    from memfit.interfaces.cli.progress import progress

    with progress(f"searching plans {imported.name} can say"):
        if a.row:
            best, files = _shown_row(base, imported, allow, a.global_batch, options, a.row, (old, io, keeps_the_step))
        else:
            best, files = _search(base, imported, allow, kept, a.global_batch, options, old, io,
                                  (says, keeps_the_step), refusals)
    _check_written(imported, io.reread(files), best, options.resume, given)
    print(f"{imported.name}: {now.verdict} ({gib(now.device_peak_bytes)} GiB per GPU) -> "
          f"{best.verdict} ({gib(best.device_peak_bytes)} GiB, {best.tokens_per_second:,.0f} tokens/s)")
    _print_notes(notes, base)
    if note := _read_back_note(imported, io.reread(files), best, given):
        print(note)
    _other_file_note(base, imported, allow, kept, a.global_batch, options, best)
    for k, v in asked.items():
        print(f"  {k}: {'unset' if old[k] is None else old[k]} -> {v}  (asked on the command line)")
    for c in best.changes:
        print(f"  {c.knob}: {c.before} -> {c.after}  {_effect(c)}{' (needed to fit)' if c.needed_to_fit else ''}"
              f"{' [CODE EDIT: no flag, see below]' if c.code_edit else ''}")
    print(diff(files) or "(no change to write: the file already fits as planned)")
    writes = [FileWrite(io.target(files, f.path), f.new_text, f.old_text if a.in_place else UNCHECKED)
              for f in files if f.changed]  # in place: refused if the file changed since it was read
    changed = {Path(f.path).resolve() for f in files if f.changed}
    copies = [] if a.in_place else [FileWrite(io.target(files, p), Path(p).read_text(encoding="utf-8"), UNCHECKED)
                                    for p in sorted(io.read()) if Path(p).resolve() not in changed]
    writes += copies  # --out holds the whole launch, so it runs (and reads back) from there
    edits = [c for c in best.changes if c.code_edit]
    text = _code_edit_text(imported, edits) if edits else ""
    if edits:
        folder = Path(imported.path).parent if a.in_place else Path(a.out)
        writes.append(FileWrite(folder / f"{imported.name}.code-edit.txt", text))
    written = write_files(writes, backup=a.in_place)  # every file or none
    for w in written[:len(written) - len(copies) - bool(edits)]:
        print(_wrote(w))
    if copies:
        print(f"copied the launch's {len(copies)} unchanged file(s) beside them, in its layout")
    if edits:  # the code-edit file is the last one written
        print(f"\nNEEDS A CODE EDIT as well ({imported.format} has no flag for it):\n{text}{_wrote(written[-1])}")
    if written:
        print(_next_words(a, written[0].path))
    return 0


def _next_words(a: argparse.Namespace, path) -> str:
    """fit's last line: the estimate of the file as written (from the launch folder, where its paths resolve)."""
    return f"next: launch it; its whole estimate: memfit estimate {_machine_words(a)} --from {shlex.quote(str(path))}"


def _machine_words(a: argparse.Namespace) -> str:
    """The model (when given) and the machine of this fit, as estimate / plan words."""
    from memfit.facts.knobs import hardware
    from memfit.interfaces.cli.next_steps import flag_words

    words = [shlex.quote(a.model)] if a.model else []  # estimate's and plan's model is their first word
    words += [shlex.quote(w) for name in hardware() if getattr(a, name, None) is not None
              for w in flag_words(name, getattr(a, name))]
    return " ".join(words)


def _print_notes(notes: list[str], base) -> None:
    """What the file's readers assumed or warned about (also under "assumed" of `memfit estimate --from`), and a
    sequence past the model's positions, which the plan is estimated at as given."""
    from memfit.facts.profiles import beyond_positions

    for note in notes:
        print(f"  note: {note}")
    for warning in beyond_positions(base):
        print(f"  warning: {warning}")


def _search(base, imported, allow, kept, global_batch, options, old, io, checks, refusals):
    """The fastest plan the files can say: the search tries only settings they can say (Keep.expressible, the
    first of `checks`); a combination the writer still refuses, or whose files read back as another step (the
    second), sends it on to the next rows."""
    from memfit.planner.plan import choose_for_fit, plan
    from memfit.planner.search import Keep

    says, keeps_the_step = checks
    keep = Keep(axes=kept, expressible=says)
    for top_k in (10, 40):
        writable = []
        for row in plan(base, allow, global_batch, top_k=top_k, options=options, keep=keep):
            try:
                files = io.write(_file_changes(row, old, io.said))
                keeps_the_step(files, row)  # read back: a launch's reader can refuse it too (finetune.py: ZeRO-3 + LoRA)
                writable.append((row, files))
            except MemfitError as e:
                refusals.setdefault(str(e), str(e))
        best = choose_for_fit([row for row, _ in writable])
        if best is not None:
            return best, next(files for row, files in writable if row is best)
    why = f"; {next(iter(refusals))}" if refusals else " (see `memfit plan`; --allow lora,qlora widens the search)"
    if not refusals and base.hardware.host_ram and options.resume:
        why += "; host RAM is judged at a resume from a checkpoint too (--no-resume if the run never resumes)"
    raise MemfitError(f"no configuration of {base.model.id} that {imported.format} can express fits "
                      f"{base.hardware.gpus_per_node} x {base.hardware.gpu.name}{why}")


PLAN_TOP = 5  # the rows `memfit plan` shows by default (its --top)


def _shown_row(base, imported, allow, global_batch, options, n: int, writing):
    """--row N: plan N as `memfit plan --from FILE` shows it (the same search, free of what the file can say),
    written as it is; a plan the file cannot hold is one line naming what it lacks."""
    from memfit.planner.plan import search_plans

    old, io, keeps_the_step = writing
    rows = search_plans(base, allow, global_batch, top_k=max(PLAN_TOP, n), options=options).rows
    if n > len(rows):
        raise MemfitError(f"--row {n}: memfit plan shows {len(rows)} plan(s) for {imported.name}; "
                          + (f"choose 1 to {len(rows)}" if rows else "none fits (see `memfit plan`)"))
    row = rows[n - 1]
    try:
        files = io.write(_file_changes(row, old, io.said))
        keeps_the_step(files, row)
    except MemfitError as e:
        raise MemfitError(f"plan {n} cannot be written into {imported.name}: {e}") from None
    return row, files


def _check_written(imported, again, best, resume: bool, given: dict) -> None:
    """The files as they will be written, read back (`again`) and estimated (with the code edit beside them
    applied), must be the plan: a writer that drops a key or a path that resolves elsewhere shows up here, before
    anything is written. A launch is read back whole, every file as it will be."""
    from memfit.planner.search import judge
    from memfit.roles.estimate import estimate

    s = best.scenario
    e = judge(estimate(_written_run(imported, again, best, given)), resume)
    gpu = s.hardware.gpu.memory_bytes
    if e.verdict != best.verdict or abs(e.device_peak - best.device_peak_bytes) > AGREE * gpu:
        from memfit.interfaces.render.common import gib

        raise MemfitError(f"{imported.name}: internal error: the rewritten file reads back as {e.verdict} at "
                          f"{gib(e.device_peak)} GiB per GPU, the plan said {best.verdict} at "
                          f"{gib(best.device_peak_bytes)} GiB; nothing written")


def _written_run(imported, again, row, given: dict):
    """The run the rewritten files (`again`, read back) say, with the plan's code edit beside them applied."""
    from memfit.facts.profiles import build_scenario

    s = row.scenario
    edited = {k: getattr(s, k) for c in row.changes if c.code_edit for k in axes()[c.knob]}
    try:
        return build_scenario(s.model, s.hardware, again.knobs | edited | given, imported.profile)
    except MemfitError as e:
        raise MemfitError(f"{imported.name}: the rewritten file does not read back as a run: {e}") from None


def _lost_knobs(written, planned) -> tuple[list[str], dict, dict]:
    """The knobs (that act in the plan) whose value the written files read back differently, and both values."""
    from memfit.facts.knobs import inert_because
    from memfit.interfaces.formats import knobs_from_scenario

    want, got = knobs_from_scenario(planned), knobs_from_scenario(written)
    return [k for k in want if got.get(k) != want[k] and inert_because(planned, k) is None], want, got


def _read_back_note(imported, again, best, given: dict) -> str:
    """Where the files as written read back with another value of a knob than the plan (inside the agreement
    `_check_written` allows): named, so the numbers above are not taken for the file's."""
    lost, want, got = _lost_knobs(_written_run(imported, again, best, given), best.scenario)
    if not lost:
        return ""
    return (f"  note: {imported.format} cannot say " + ", ".join(f"{k}={want[k]!r}" for k in lost) + "; written, the "
            "file reads back as " + ", ".join(f"{k}={got.get(k)!r}" for k in lost) + f" (within {AGREE:.0%} of the "
            "GPU of this plan's peak: `memfit estimate --from` the written file gives its own numbers)")


def _same_knobs(imported, written, planned) -> None:
    """The files as written read back as every knob of the plan, or the first knob they lose is named: a plan
    the format cannot hold (DeepSpeed's bf16 section keeps fp32 master weights: bf16-pure reads back as mixed)."""
    lost, want, got = _lost_knobs(written, planned)
    if lost:
        k = lost[0]
        more = f" (and {len(lost) - 1} more: {', '.join(lost[1:])})" if len(lost) > 1 else ""
        raise MemfitError(f"{imported.name}: {imported.format} cannot say {k}={want[k]!r} beside this plan's other "
                          f"settings: written, it reads back as {k}={got.get(k)!r}{more}")


def _step_of(s) -> tuple:
    """What one optimizer step trains on: rows (micro-batch x accumulation x GPUs), padding, sequence length."""
    return s.micro_batch * s.grad_accum * s.world_size, s.padding, s.seq_len


def _other_file_note(base, imported, allow, kept, global_batch, options, best) -> None:
    """When a faster plan needs a setting this file cannot say (flash attention in a bare DeepSpeed JSON), say
    what and where it would go."""
    from memfit.planner.plan import plan
    from memfit.planner.search import Keep
    from memfit.planner.throughput import ties

    rows = plan(base, allow, global_batch, top_k=1, options=options, keep=Keep(axes=kept))
    if not rows or rows[0].tokens_per_second <= best.tokens_per_second or ties(rows[0].tokens_per_second,
                                                                                best.tokens_per_second):
        return  # no faster plan, or one the step-time model cannot tell from this one
    mine = {(c.knob, str(c.after)) for c in best.changes}
    other = [f"{c.knob} {c.before} -> {c.after}" for c in rows[0].changes if (c.knob, str(c.after)) not in mine]
    print(f"(a plan {rows[0].tokens_per_second / best.tokens_per_second - 1:.0%} faster also needs "
          f"{', '.join(other)}, which {imported.name} cannot say: it belongs in the file that sets it "
          f"(training arguments, the launch command, a DeepSpeed JSON or the framework's code; see `memfit plan`))")


def _changes_of(scenario, old: dict, sayable: frozenset[str], edited: set[str]) -> dict:
    """The knobs a scenario changes that a file would have to say (what a code edit reaches goes beside it)."""
    from memfit.interfaces.formats import knobs_from_scenario

    moved = {k for axis_knobs in axes().values() for k in axis_knobs}
    return {k: v for k, v in knobs_from_scenario(scenario).items()
            if old.get(k) != v and k not in edited and (k in moved or k in sayable)
            and not _default(k, v, old, sayable, scenario.profile)}


def _default(k: str, v, old: dict, sayable: frozenset[str], profile: str) -> bool:
    """A knob that starts acting (a new engine's ratio) at the value reading the file back gives: its default in a
    file that cannot say it, or the framework's own default (a new FSDP's version): nothing to write."""
    from memfit.facts.frameworks import framework
    from memfit.facts.knobs import knob

    if k in old:
        return False
    return (k not in sayable and v == knob(k).default) or (knob(k).profile and framework(profile).defaults.get(k) == v)


def _file_changes(row, old: dict, sayable: frozenset[str]) -> dict:
    """The knobs to write for a plan: those of the axes it changes, plus any other knob its scenario moved on
    the way that the file can say (ZeRO-3 -> 2 resets the offload ratio to 1: a file keeping 0.9 is one DeepSpeed
    rejects, and the next `memfit fit` with it). What a code edit reaches goes beside the file, never into it."""
    from memfit.interfaces.formats import knobs_from_scenario

    wanted = {k for c in row.changes if not c.code_edit for k in axes()[c.knob]}
    edited = {k for c in row.changes if c.code_edit for k in axes()[c.knob]}
    return {k: v for k, v in knobs_from_scenario(row.scenario).items()
            if old.get(k) != v and (k in wanted or (k in sayable and k not in edited))
            and not _default(k, v, old, sayable, row.scenario.profile)}


def _wrote(w) -> str:
    if w.unchanged:
        return f"{w.path} already holds this (not rewritten)"
    return f"wrote {w.path}" + (f" (the original is in {w.backup})" if w.backup else "")


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
