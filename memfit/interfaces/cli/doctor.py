"""`memfit doctor LOG`: what a training log or a pasted error says about memory, and with the run's config
(--from FILE or the scenario flags) memfit's estimate beside it and the fixes, ranked.

Presentation only: reading the log is memfit/interfaces/logs/. Registered by main.py::build_parser through
`add_doctor_command(sub)`."""
from __future__ import annotations

import argparse
import json

from memfit.errors import MemfitError
from memfit.interfaces.cli.args import add_scenario_arguments, positive_int

FORMS = ("PyTorch's CUDA out-of-memory errors (every form since 1.0), DefaultCPUAllocator errors, SIGKILL exits "
         "(the DeepSpeed launcher's return code -9, torchrun's exitcode -9, the kernel's OOM killer, Ray's memory "
         "monitor), NCCL memory errors and DeepSpeed's see_memory_usage lines")
BINARY_SHARE = 0.10  # of the first characters: more undecodable or control characters than this is not a log
SAMPLE = 65536


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
    from memfit.interfaces.logs.diagnose import diagnose

    text = read_log(a.log)
    report = parse_log(text)
    if not report.failures and not report.timeline:
        kind = "" if looks_like_text(text) else " (it is not text)"
        raise MemfitError(f"no memory failure found in {a.log}{kind}; memfit doctor reads {FORMS}")
    scenario = config_scenario(a, report)
    if a.html and scenario is None:
        raise MemfitError("--html draws memfit's estimate beside the log: give the run's config (--from FILE, or "
                          "MODEL --gpu ... with its knobs)")
    d = diagnose(report, scenario)
    d.fixes = d.fixes[: a.top]
    if a.html:  # the estimate's bars with the log's figures as levels (render/html_doctor.py)
        from memfit.interfaces.render.html import write_page
        from memfit.interfaces.render.html_doctor import doctor_page
        from memfit.roles.estimate import estimate

        write_page(a.html, doctor_page(d.to_json(), estimate(scenario).to_json(), a.log))
    if a.json:
        print(json.dumps(d.to_json(), indent=2))
    else:
        print_diagnosis(d, report)
    return 0


def looks_like_text(text: str) -> bool:
    head = text[:SAMPLE]
    odd = sum(1 for c in head if c == "\ufffd" or (ord(c) < 32 and c not in "\n\r\t\x1b"))
    return bool(head) and odd <= BINARY_SHARE * len(head)


def config_scenario(a: argparse.Namespace, report):
    """The run's Scenario when a model or a config file is given; a GPU the flags leave out is the log's own
    (its total capacity)."""
    from memfit.interfaces.cli.args import scenario_from_args

    if not (a.model or a.from_file):
        return None
    if not (a.gpu or a.gpu_mem):
        total = next((f.total_bytes for f in report.failures if f.kind == "cuda_oom" and f.total_bytes), None)
        if total is None:
            raise MemfitError("say which GPU the run used (--gpu NAME or --gpu-mem 24GiB): the log does not give "
                              "its total capacity")
        a = argparse.Namespace(**{**vars(a), "gpu_mem": str(total)})
    return scenario_from_args(a)


def print_diagnosis(d, report) -> None:
    from memfit.interfaces.logs.diagnose import gib

    for i, f in enumerate(d.failures, 1):
        where = ", ".join(x for x in (f.phase, f.component) if x) or "phase not in the log"
        print(f"failure {i}: {f.kind} (line {f.line}, {f.form}): {where}")
        if f.kind == "cuda_oom" and f.total_bytes:
            print(f"   GPU {f.gpu if f.gpu is not None else '?'}: asked {gib(f.tried_to_allocate_bytes)}, free "
                  f"{gib(f.free_bytes)} of {gib(f.total_bytes)}; allocated {gib(f.allocated_bytes)}, reserved but "
                  f"unallocated {gib(f.reserved_unallocated_bytes)}, other processes {gib(f.other_processes_bytes)}")
    if report.timeline:
        print(f"timeline: {len(report.timeline)} see_memory_usage reports")
    print("findings:")
    for x in d.findings:
        print(f" - {x['text']}")
    if d.fixes:
        print("fixes, best first:")
    for fx in d.fixes:
        speed = f", {fx['tokens_per_second']:,.0f} tokens/s predicted" if fx.get("tokens_per_second") else ""
        print(f" {fx['rank']}. {fx['fix']}  [{fx['from']}{speed}]")
        for edit in fx.get("code_edits") or []:
            print(f"      needs a code edit (no flag): {edit}")
    if not any(fx["from"] == "planner" for fx in d.fixes):
        print("(give the run's config, --from FILE or MODEL --gpu ... with its knobs, for memfit's estimate and "
              "ranked fixes)")
