"""`memfit doctor LOG`: what a training log or a pasted error says about memory, and with the run's config
(--from FILE or the scenario flags) memfit's estimate beside it and the fixes, ranked.

Presentation only: reading the log is memfit/interfaces/logs/. Registered by main.py::build_parser through
`add_doctor_command(sub)`."""
from __future__ import annotations

import argparse
import json
import textwrap

from memfit.errors import MemfitError
from memfit.interfaces.cli.args import add_scenario_arguments, positive_int

FORMS = ("PyTorch's CUDA out-of-memory errors (every form since 1.0), DefaultCPUAllocator errors, SIGKILL exits "
         "(the DeepSpeed launcher's return code -9, torchrun's exitcode -9, the kernel's OOM killer, Ray's memory "
         "monitor), NCCL memory errors and DeepSpeed's see_memory_usage lines")
BINARY_SHARE = 0.10  # of the first characters: more undecodable or control characters than this is not a log
SAMPLE = 65536
WIDTH = 80  # every printed line fits a terminal's default width


def add_doctor_command(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="explain a training log or pasted error: what ran out, where, and "
                                             "what to change")
    p.add_argument("log", metavar="LOG", help="the log file or pasted error (- reads stdin)")
    add_scenario_arguments(p)
    p.add_argument("--top", type=positive_int, default=5, help="fixes to show (default 5)")
    p.add_argument("--json", action="store_true", help="print the memfit.doctor/1 JSON document")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report (memfit's estimate with "
                                                  "the log's figures) to FILE; needs the run's config")
    p.set_defaults(run=run_doctor)


def run_doctor(a: argparse.Namespace) -> int:
    from memfit.interfaces.logs import parse_log, read_log
    from memfit.interfaces.logs.diagnose import diagnose, primary, reconcile_capacity

    text = read_log(a.log)
    report = parse_log(text)
    if not report.failures and not report.timeline:
        kind = "" if looks_like_text(text) else " (it is not text)"
        raise MemfitError(f"no memory failure found in {a.log}{kind}; memfit doctor reads {FORMS}")
    a = with_log_gpu(a, report)
    scenario = config_scenario(a)
    if a.html and scenario is None:
        raise MemfitError("--html draws memfit's estimate beside the log: give the run's config (--from FILE, or "
                          "MODEL --gpu ... with its knobs)")
    note = None
    if scenario is not None and a.gpu and not a.gpu_mem:  # a typed --gpu-mem is the user's own figure: kept
        scenario, note = reconcile_capacity(scenario, primary(report.failures))
    d = diagnose(report, scenario)
    if note:
        d.findings.insert(0, note)
    d.fixes = d.fixes[: a.top]
    if a.html:  # the estimate's bars with the log's figures as levels (render/html_doctor.py)
        from memfit.interfaces.render.html import write_page
        from memfit.interfaces.render.html_doctor import doctor_page
        from memfit.roles.estimate import estimate

        write_page(a.html, doctor_page(d.to_json(), estimate(scenario).to_json(), a.log))
    if a.json:
        print(json.dumps(d.to_json(), indent=2))
    else:
        for line in diagnosis_lines(d, report, a):
            print(line)
    return 0


def looks_like_text(text: str) -> bool:
    head = text[:SAMPLE]
    odd = sum(1 for c in head if c == "\ufffd" or (ord(c) < 32 and c not in "\n\r\t\x1b"))
    return bool(head) and odd <= BINARY_SHARE * len(head)


def with_log_gpu(a: argparse.Namespace, report) -> argparse.Namespace:
    """The arguments with the log's GPU (its total capacity as --gpu-mem) when a config is given without one,
    so the estimate and the `memfit plan` command doctor prints are for the card the log ran on."""
    if not (a.model or a.from_file) or a.gpu or a.gpu_mem:
        return a
    total = next((f.total_bytes for f in report.failures if f.kind == "cuda_oom" and f.total_bytes), None)
    if total is None:
        raise MemfitError("say which GPU the run used (--gpu NAME or --gpu-mem 24GiB): the log does not give "
                          "its total capacity")
    return argparse.Namespace(**{**vars(a), "gpu_mem": str(total)})


def config_scenario(a: argparse.Namespace):
    """The run's Scenario when a model or a config file is given."""
    from memfit.interfaces.cli.args import scenario_from_args

    return scenario_from_args(a) if a.model or a.from_file else None


def wrap(text: str, first: str = "", rest: str = "   ") -> list[str]:
    """Prose wrapped to WIDTH columns: `first` before its first line, `rest` before the others."""
    # a path or a command word is never cut (it must paste back whole): only one longer than a line overflows
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False,
                         break_long_words=False)


def answer_lines(text: str) -> list[str]:
    """The answer on the first line whole: a closing parenthesis that does not fit goes to the next line rather
    than being cut."""
    head, paren, rest = text.rpartition(" (")
    if len(text) <= WIDTH or not paren or not text.endswith(")") or len(head) > WIDTH:
        return wrap(text, rest="  ")
    return [head] + wrap("(" + rest, "  ", "   ")


def diagnosis_lines(d, report, a: argparse.Namespace) -> list[str]:
    """The answer first (what ran out, where, by how much), then what the figures show, the fixes best first,
    and last what to do next."""
    from memfit.interfaces.logs.advice import headline, where_line
    from memfit.interfaces.logs.diagnose import primary

    main = primary(d.failures)
    if main:
        out = answer_lines(headline(main)) + wrap(where_line(main), rest="  ")
    else:
        out = wrap(f"no OOM error in the log; its {len(report.timeline)} DeepSpeed see_memory_usage reports "
                   "show:", rest="  ")
    for f in (f for f in d.failures if f is not main):
        out += wrap(f"{headline(f)} (line {f.line})", "also: ")
    if report.timeline and main:
        out.append(f"timeline: {len(report.timeline)} DeepSpeed see_memory_usage reports")
    for x in d.findings:
        if "line" not in x:  # a failure's own finding is its answer, printed above
            out += wrap(x["text"], " - ")
    return out + fix_lines(d.fixes) + next_lines(d, a)


def fix_lines(fixes: list[dict]) -> list[str]:
    if not fixes:
        return []
    alone = all(fx["from"] != "planner" for fx in fixes)
    out = ["fixes, best first" + (" (from the log alone):" if alone else ":")]
    for fx in fixes:
        speed = f"  [{fx['tokens_per_second']:,.0f} tokens/s predicted]" if fx.get("tokens_per_second") else ""
        out += wrap(f"{fx['fix']}{speed}", f" {fx['rank']}. ", "      ")
        for edit in fx.get("code_edits") or []:
            out += wrap(f"needs a code edit (no flag): {edit}", "      ", "        ")
    return out


def next_lines(d, a: argparse.Namespace) -> list[str]:
    """The last lines: with the config, the command that searches further; without, the config to ask for."""
    import shlex

    from memfit.interfaces.cli.next_steps import command_words

    plan = ["memfit", "plan", *command_words(a)]
    if any(fx["from"] == "planner" for fx in d.fixes):
        return ["next: more plans for this run:"] + command_lines(plan)
    if a.model or a.from_file:
        return wrap("next: memfit finds no change that fits this config by its estimate; try the fixes above, or "
                    "search wider:", rest="  ") + command_lines(plan)
    return wrap("next: give the run's config to rank these by memfit's estimate (or MODEL --gpu NAME with its "
                "knobs):", rest="  ") + command_lines(["memfit", "doctor", shlex.quote(a.log), "--from", "CONFIG"])


def command_lines(words: list[str], indent: str = "  ") -> list[str]:
    """A shell command in WIDTH columns that still pastes whole: lines end in a backslash, which the shell
    removes with the newline; a word longer than a line (a deep config path) is cut the same way, its rest at
    column 0 because spaces there would split it."""
    lines, line = [], indent
    for word in words:
        if line.strip() and len(line) + 1 + len(word) + 2 > WIDTH:  # room for the closing " \"
            lines.append(line + " \\")
            line = indent * 2
        elif line.strip():
            line += " "
        while len(line) + len(word) + 2 > WIDTH:
            cut = WIDTH - len(line) - 1
            lines.append(line + word[:cut] + "\\")
            line, word = "", word[cut:]
        line += word
    return lines + [line]
