"""`memfit` command line: parse arguments into a Scenario, run a job, hand the result to rendering.

Every bad input becomes one line on stderr and exit code 2 (MemfitError); nothing here computes memory.
"""
from __future__ import annotations

import argparse
import sys

from memfit.errors import MemfitError
from memfit.interfaces.cli.args import Parser, add_length_arguments, add_scenario_arguments, positive_int, \
    scenario_from_args


def _cmd_estimate(a) -> int:
    from memfit.roles.estimate import estimate

    from memfit.interfaces.lengths.cli import lengths_report, print_lengths
    from memfit.interfaces.lengths.read import read_lengths

    from memfit.interfaces.cli.run_cost import speed_section

    result = estimate(scenario_from_args(a))
    from memfit.interfaces.cli.progress import progress

    with progress(f"reading the token lengths of {a.lengths}", a):
        data = read_lengths(a.lengths, result.scenario.model) if a.lengths else None  # read once, for both below
    lengths = lengths_report(a, result.scenario, data)  # --lengths DATA: per-step, per-rank peaks (None without it)
    speed = speed_section(a, result.scenario, data)  # the step-time model's answer, beside the memory one
    from memfit.interfaces.cli.next_steps import next_steps

    nxt = next_steps(a, result)  # an OOM's cheapest changes that fit (re-read as flags), or the launch hint
    if a.html:  # the page as well as the usual output (render/html.py draws the --json document)
        from memfit.interfaces.render.html import estimate_page, write_page
        from memfit.planner.sweep import sweeps

        # plus the batch and sequence sweeps (the page's only numbers not in --json: estimates of nearby runs)
        write_page(a.html, estimate_page(result.to_json() | {"sweep": sweeps(result.scenario)}
                                         | {"next_steps": nxt.to_json(), "plan_command": nxt.plan_command}))
    if a.json:
        import json

        print(json.dumps(result.to_json() | {"speed": speed} | ({"lengths": lengths.to_json()} if lengths else {})
                         | {"next_steps": nxt.to_json(), "plan_command": nxt.plan_command}, indent=2))
    else:
        from memfit.interfaces.render.estimate import print_estimate, print_next_steps, print_speed

        print_estimate(result, brief=a.brief)
        if not a.brief:
            print_speed(speed, result.scenario.world_size)
        if lengths and not a.brief:
            print_lengths(lengths)
        print_next_steps(result, nxt)  # every output ends with what to do next
    return 0


def _cmd_trace(a) -> int:
    from memfit.trace import render, run_trace, write_timeline

    from memfit.interfaces.cli.progress import progress

    scenario = scenario_from_args(a)
    with progress(f"tracing {scenario.model.id}: the real modeling code on fake tensors", a):
        result = run_trace(scenario, steps=a.steps)
    if a.timeline:
        write_timeline(result, a.timeline)
    if a.html:  # the page draws the document --timeline writes (render/html_trace.py)
        from memfit.interfaces.render.html import write_page
        from memfit.interfaces.render.html_trace import trace_page

        gpu = scenario.hardware.gpu
        write_page(a.html, trace_page(result.to_json(timeline=True), scenario.model.id, gpu.name, gpu.memory_bytes))
    if a.json:
        import json

        print(json.dumps(result.to_json(timeline=False), indent=2))
    else:
        from rich.console import Console

        console = Console()
        render(result, console)
        gpu = scenario.hardware.gpu
        peak = result.profile.peak.total
        if peak > gpu.memory_bytes:
            console.print(f"[bold red]OOM[/]: the traced tensors alone ({peak / 2**30:.2f} GiB allocated, before the "
                          f"allocator cache and CUDA context) exceed {gpu.name}'s {gpu.memory_bytes / 2**30:.2f} GiB")
        else:
            console.print(f"traced allocated peak {peak / 2**30:.2f} GiB of {gpu.name}'s "
                          f"{gpu.memory_bytes / 2**30:.2f} GiB (`memfit estimate` adds cache, context and NCCL)")
        if a.compare:
            from memfit.interfaces.render.estimate import print_comparison
            from memfit.roles.estimate import estimate

            print_comparison(estimate(scenario).allocated, result.profile, "trace")
    return 0


def _cmd_measure(a) -> int:
    from memfit.measure import render, run_measure

    from memfit.interfaces.cli.progress import progress

    scenario = scenario_from_args(a)
    with progress(f"measuring {scenario.model.id}: the real engine on {scenario.world_size} rank(s)", a):
        result = run_measure(scenario, steps=a.steps, model_dir=a.weights)
    if a.json:
        import json

        print(json.dumps(result.to_json(), indent=2))
        return 0
    from rich.console import Console

    from memfit.roles.estimate import estimate
    from memfit.interfaces.render.estimate import print_comparison

    render(result, Console())
    worst = max(result.ranks, key=lambda r: r.device.peak.total)
    print_comparison(estimate(scenario).allocated, worst.device, "measured (worst rank)")
    return 0


def _cmd_models(a) -> int:
    from memfit.facts.catalog import models
    from memfit.memory.inventory import count_params

    key = (a.filter or "").lower()
    every = models()
    rows = [(m.id, m.arch, f"{count_params(m) / 1e9:.2f}B", ", ".join(m.aliases))
            for m in every if key in m.id.lower() or key in m.arch or any(key in x.lower() for x in m.aliases)]
    families = sorted({m.arch for m in every})
    return _print_listing("model", ("id", "family", "params", "aliases"), rows, a.filter, len(every),
                          f"a part of an id, alias or family ({', '.join(families[:6])}, ...)",
                          "memfit estimate MODEL --gpu GPU (a hub id or a local config.json works too)")


def _cmd_gpus(a) -> int:
    from memfit.facts.catalog import gpus

    key = (a.filter or "").lower()
    every = gpus()
    rows = [(g.id, g.name, f"{g.memory_bytes / 2**30:.2f} GiB", f"{g.bf16_tflops:g} TFLOP/s", g.interconnect,
             ", ".join(g.aliases))
            for g in every if key in g.id.lower() or key in g.name.lower() or any(key in x.lower() for x in g.aliases)]
    return _print_listing("GPU", ("id", "name", "usable", "bf16", "link", "aliases"), rows, a.filter, len(every),
                          "a part of an id, name or alias (rtx4090, a100, h100, ...)",
                          "memfit estimate MODEL --gpu GPU (or --gpu-mem 24GiB for a card not listed)")


def _print_listing(kind: str, header: tuple[str, ...], rows: list[tuple], key: str | None, total: int,
                   valid: str, next_step: str) -> int:
    """A catalog, one line per entry (columns padded, the last one free: lines are never wrapped mid-entry); an
    empty filter says so in one line with what would match."""
    if not rows:
        print(f"no {kind} matches {key!r}: filter by {valid}; `memfit {kind.lower()}s` lists all {total}")
        return 1
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header) - 1)]
    shown = f"{len(rows)} of {total}" if key else f"{total}"
    print(f"{shown} {kind}s" + (f" matching {key!r}" if key else "") + ":")
    for r in (header, *rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + str(r[-1]))
    print(f"next: {next_step}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="memfit", description="Will this fine-tuning run fit in GPU and host memory?")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    est = sub.add_parser("estimate", help="predict per-GPU and host memory, with a breakdown and a verdict")
    add_scenario_arguments(est)
    est.add_argument("--json", action="store_true", help="print the documented JSON document instead of tables")
    est.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report (charts) to FILE")
    add_length_arguments(est)
    from memfit.interfaces.lengths.cli import add_lengths_arguments

    add_lengths_arguments(est)
    from memfit.interfaces.cli.run_cost import add_run_cost_arguments

    add_run_cost_arguments(est)
    est.set_defaults(run=_cmd_estimate)
    tr = sub.add_parser("trace", help="run the real transformers/PEFT step on fake tensors (needs memfit[trace])")
    add_scenario_arguments(tr)
    tr.add_argument("--steps", type=positive_int, default=2, help="training steps; the last one is reported (default 2)")
    tr.add_argument("--timeline", help="write the allocation timeline to this JSON file")
    tr.add_argument("--compare", action="store_true", help="also print memfit's analytic estimate beside the trace")
    tr.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report (the timeline, the "
                                                   "phases' peaks) to FILE")
    tr.add_argument("--json", action="store_true")
    tr.set_defaults(run=_cmd_trace)
    me = sub.add_parser("measure", help="run real steps on the real engine (needs memfit[measure]; CUDA or CPU+gloo)")
    add_scenario_arguments(me)
    me.add_argument("--steps", type=positive_int, default=3, help="training steps before the checkpoint save and resume")
    me.add_argument("--weights", help="a local folder with real weights (default: random init from the catalog)")
    me.add_argument("--json", action="store_true")
    me.set_defaults(run=_cmd_measure)
    from memfit.interfaces.cli.calibrate import add_calibrate_command
    from memfit.interfaces.cli.doctor import add_doctor_command
    from memfit.interfaces.cli.fit import add_fit_command
    from memfit.interfaces.cli.plan import add_plan_command
    from memfit.interfaces.cli.serve import add_serve_command
    from memfit.interfaces.cli.watch import add_watch_command

    add_plan_command(sub)
    add_fit_command(sub)
    add_doctor_command(sub)
    add_watch_command(sub)
    add_calibrate_command(sub)
    add_serve_command(sub)
    for name, fn in (("models", _cmd_models), ("gpus", _cmd_gpus)):
        sp = sub.add_parser(name, help=f"list the {name} catalog")
        sp.add_argument("filter", nargs="?", help="substring to filter by")
        sp.set_defaults(run=fn)
    from memfit.interfaces.cli.examples import add_examples

    add_examples(sub)  # short usage lines and examples, after every command is registered
    return p


# characters str.splitlines() (and some terminals) break a line at; an argument or file value may hold one
_LINE_BREAKS: dict[str, str | int | None] = {c: repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}


def one_line(message: str) -> str:
    """The error as one line: a line break inside a quoted value is shown escaped (\\n), as repr would."""
    return message.strip().translate(str.maketrans(_LINE_BREAKS))


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except MemfitError as e:
        print(f"memfit: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:  # a file the user named cannot be read or written (--out, --timeline): the OS says why
        print(f"memfit: error: {one_line(f'{e.filename}: {e.strerror}' if e.filename else str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
