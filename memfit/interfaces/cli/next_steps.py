"""`memfit estimate`'s last lines: what to do next.

Not fitting (OOM, tight, host OOM): the planner's cheapest small changes that fit (memfit/planner/next_steps.py),
each as the flags to add to the same command. Each is read back through the command line's own path (the
arguments with those flags set, as argparse would leave them) and estimated again, so a flag the CLI would
refuse, or a default the CLI fills in differently from the planner, never reaches the user as "fits". Then the
`memfit plan` command that searches further. Fitting: one line on launching it, and the plan command for speed.
"""
from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

from memfit.errors import MemfitError
from memfit.facts.knobs import hardware, inputs, knobs

SHOWN = 3  # changes shown; more read as a plan, which `memfit plan` prints better
SPELLING = {"from_file": "--from"}  # the alias the README and the help use, over the table's long name


@dataclass(frozen=True)
class Step:
    flags: tuple[str, ...]
    device_total_bytes: int
    verdict: str
    speed_cost: float  # share of the start's tokens/s (step-time model); negative: faster

    def to_json(self) -> dict:
        return {"flags": list(self.flags), "device_total_bytes": self.device_total_bytes, "verdict": self.verdict,
                "speed_cost": round(self.speed_cost, 4)}


@dataclass(frozen=True)
class NextSteps:
    verdict: str
    steps: tuple[Step, ...] = ()
    plan_command: str = ""
    fit_command: str = ""  # `memfit fit FILE ...` when the run came from a file

    def to_json(self) -> list[dict]:
        return [s.to_json() for s in self.steps]


def next_steps(a: argparse.Namespace, result) -> NextSteps:
    plan = "memfit plan " + " ".join(command_words(a))
    fit = _fit_command(a)
    if result.verdict == "fits":
        return NextSteps("fits", (), plan, fit)
    return NextSteps(result.verdict, tuple(_verified(a, result)), plan, fit)


def _verified(a: argparse.Namespace, result) -> list[Step]:
    """The planner's changes read back through the CLI and estimated again: those that still fit, cheapest first."""
    from memfit.planner.next_steps import cheapest_changes
    from memfit.planner.step_time import step_time
    from memfit.roles.estimate import estimate

    from memfit.interfaces.cli.args import scenario_from_args

    start = _speed(step_time, result.scenario)
    out = []
    for change in cheapest_changes(result.scenario):
        try:
            s = scenario_from_args(argparse.Namespace(**(vars(a) | change.fields)))
            e = estimate(s)
        except MemfitError:  # the command line refuses this combination: not a step to offer
            continue
        if e.verdict != "fits":
            continue
        cost = 1.0 - _speed(step_time, s) / start if start > 0 else 0.0
        out.append(Step(flags_for(change.fields), e.device_total.peak.total, e.verdict, cost))
        if len(out) == SHOWN:
            break
    return sorted(out, key=lambda st: st.speed_cost)


def _speed(step_time, s) -> float:
    try:
        return step_time(s).tokens_per_second
    except MemfitError:
        return 0.0


def flag_words(name: str, value) -> list[str]:
    """One knob's value as the command line says it (the knob table's flag; --no-X for a false switch)."""
    k = {**inputs(), **hardware(), **knobs()}[name]
    flag = SPELLING.get(name, k.flag)
    if k.type == "bool":
        return [k.flag if value else "--no-" + k.flag[2:]]
    if isinstance(value, float):
        return [flag, f"{value:g}"]
    if isinstance(value, (list, tuple)):  # --from A --from B, --framework-version X --framework-version Y
        return [w for v in value for w in (flag, str(v))]
    return [flag, str(value)]


def flags_for(fields: dict) -> tuple[str, ...]:
    return tuple(w for name, value in fields.items() for w in flag_words(name, value))


def command_words(a: argparse.Namespace) -> list[str]:
    """The scenario arguments the user gave, as a command line (quoted for a shell): what `memfit plan` needs to
    start from the same run. Options of `estimate` alone (--json, --html, --tokens, ...) are left out."""
    words = [shlex.quote(a.model)] if getattr(a, "model", None) else []
    for name in (*inputs(), *hardware(), *knobs()):
        value = getattr(a, name, None)
        if name != "model" and value is not None:
            words += [shlex.quote(w) for w in flag_words(name, value)]
    return words


def _fit_command(a: argparse.Namespace) -> str:
    """`memfit fit FILE` with the machine the estimate was for, when the run was read from one file."""
    files = getattr(a, "from_file", None) or []
    if len(files) != 1:
        return ""
    words = [shlex.quote(files[0])]
    for name in hardware():
        value = getattr(a, name, None)
        if value is not None:
            words += [shlex.quote(w) for w in flag_words(name, value)]
    return "memfit fit " + " ".join(words)


def plan_next(a: argparse.Namespace, best) -> tuple[str, str]:
    """`memfit plan`'s last line: `memfit fit FILE --row 1` for a run read from one file, else the estimate command
    with plan 1's changes as flags (a change that needs a code edit has no flag: it is named instead). The line, and
    the command alone."""
    fit = _fit_command(a)
    if fit:
        return f"next: write plan 1 into a copy of the file (--row N for plan N): {fit} --row 1", f"{fit} --row 1"
    from memfit.facts.knobs import axes
    from memfit.interfaces.formats import knobs_from_scenario

    values = knobs_from_scenario(best.scenario)
    fields = {k: values[k] for c in best.changes if not c.code_edit for k in axes()[c.knob] if k in values}
    edits = [c.knob for c in best.changes if c.code_edit]
    command = " ".join(["memfit estimate", *command_words(argparse.Namespace(**(vars(a) | fields)))])
    return f"next: check plan 1 and launch it: {command}" + (
        f" (plus its code edit of {', '.join(edits)}, above)" if edits else ""), command


def shell_lines(line: str, width: int | None = None) -> str:
    """A line holding a command, wrapped at the terminal's width with shell continuations (` \\`): each printed
    line fits, and the lines pasted into a shell are still one command."""
    import shutil

    width = width or shutil.get_terminal_size().columns
    import re

    out, current = [], ""
    for word in re.findall(r"(?:'[^']*'|[^\s'])+", line):  # a quoted word (shlex.quote) stays whole
        if current and len(current) + 1 + len(word) + 2 > width:
            out.append(current + " \\")
            current = "  " + word
        else:
            current = f"{current} {word}" if current else word
    return "\n".join(out + [current])
