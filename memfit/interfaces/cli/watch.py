"""`memfit watch RUN.jsonl...`: a monitored run (memfit.monitor.MemoryMonitor's lines) summarized per rank, with
steady growth, imbalance across ranks and fragmentation named with their likely causes and knobs; --follow
re-reads the files as the run writes them. Presentation only: reading and detecting are memfit/interfaces/runs/.
Registered by main.py::build_parser through `add_watch_command(sub)`."""
from __future__ import annotations

import argparse
import json
import re
import time

from memfit.errors import MemfitError
from memfit.interfaces.cli.args import parse_size, positive_int


def add_watch_command(subparsers) -> None:
    p = subparsers.add_parser("watch", help="summarize a monitored run (memfit.monitor lines): growth, imbalance "
                                            "across ranks, fragmentation, with causes and knobs")
    p.add_argument("runs", nargs="+", metavar="RUN.jsonl", help="monitor files (NAME.jsonl also finds "
                                                                 "NAME.rank*.jsonl)")
    p.add_argument("--follow", action="store_true", help="keep reading as the run writes (Ctrl-C stops)")
    p.add_argument("--until-steps", type=positive_int, help="with --follow: stop once every rank reached this step")
    p.add_argument("--interval", type=_seconds, default=1.0, help="with --follow: seconds between reads (default 1)")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--capacity", help="memory per device, in GiB or with a unit (80, 24GiB): when growth reaches it")
    cap.add_argument("--gpu", help="the GPU by name (see `memfit gpus`): its memory is the capacity")
    p.add_argument("--estimate-from", metavar="FILE", action="append",
                   help="the run's config (as `memfit estimate --from`): its estimate beside the measured peak; the "
                        "GPU count is the run's ranks, the GPU --gpu or the device total in the lines")
    p.add_argument("--model", help="with --estimate-from, when the file does not name the model")
    p.add_argument("--json", action="store_true", help="print the memfit.watch/1 JSON document")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report (per-rank memory over "
                                                  "the steps, the findings) to FILE; with --follow, at each update")
    p.set_defaults(run=run_watch)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value < 3600:
        raise argparse.ArgumentTypeError(f"expected seconds between 0 and 3600, got {text!r}")
    return value


def capacity_of(a: argparse.Namespace) -> int | None:
    if a.gpu:
        from memfit.facts.catalog import find_gpu

        return find_gpu(a.gpu).memory_bytes
    if a.capacity:
        text = a.capacity.strip()
        return parse_size(text + "GiB" if re.fullmatch(r"[0-9.]+", text) else text, "--capacity")
    return None


def run_watch(a: argparse.Namespace) -> int:
    from memfit.interfaces.runs.read import RunReader

    if a.until_steps and not a.follow:
        raise MemfitError("--until-steps goes with --follow")
    capacity = capacity_of(a)
    reader = RunReader(a.runs)
    reader.poll()
    if not a.follow:
        if not reader.ranks:
            raise MemfitError(f"no memfit.monitor/1 lines in {', '.join(a.runs)}")
        show(reader, capacity, a.json, indent=2, estimate=_estimate(a, reader), html=a.html)
        return 0
    estimate = None
    while True:  # Ctrl-C: main() turns KeyboardInterrupt into exit 130
        if reader.ranks:
            estimate = estimate or _estimate(a, reader)
            show(reader, capacity, a.json, indent=None, estimate=estimate, html=a.html)
            if a.until_steps and all(max(steps) >= a.until_steps for steps in reader.ranks.values()):
                return 0
        while not reader.poll():
            time.sleep(a.interval)


def _estimate(a: argparse.Namespace, reader):
    """memfit's estimate of the monitored run (--estimate-from): on as many GPUs as the run has ranks, of the GPU
    --gpu names or of the device total its lines report."""
    if not a.estimate_from:
        return None
    from memfit.interfaces.cli.args import blank_arguments, scenario_and_file
    from memfit.roles.estimate import estimate

    totals = [s.device_total for ss in reader.ranks.values() for s in ss.values() if s.device_total]
    if not a.gpu and not totals:
        raise MemfitError("--estimate-from needs the GPU: --gpu NAME (the run's lines do not say the device total)")
    args = argparse.Namespace(**{**blank_arguments(), "model": a.model, "from_file": a.estimate_from, "gpu": a.gpu,
                                 "gpu_mem": None if a.gpu else f"{max(totals)}B", "gpus_per_node": len(reader.ranks)})
    return estimate(scenario_and_file(args)[0])


def write_html(path: str, reader, report: dict, capacity: int | None) -> None:
    from memfit.interfaces.render.html import write_page
    from memfit.interfaces.render.html_run import series_of, watch_page

    by_rank = reader.by_rank()
    totals = [s.device_total for ss in by_rank.values() for s in ss if s.device_total]
    doc = report | {"series": series_of(by_rank), "capacity_bytes": capacity or (max(totals) if totals else None),
                    "finding_texts": [describe(f) for f in report["findings"]], "sources": reader.files}
    write_page(path, watch_page(doc))


def show(reader, capacity: int | None, as_json: bool, indent: int | None, estimate=None, html=None) -> None:
    from memfit.interfaces.runs.detect import watch_report

    report = watch_report(reader.by_rank(), capacity, estimate)
    if html:  # the page draws the report and the samples' series (render/html_run.py)
        write_html(html, reader, report, capacity)
    if as_json:  # --follow prints one compact document per update: a JSON line each
        print(json.dumps(report, indent=indent), flush=True)
    else:
        print_report(report)


def _gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:,.3f}"


def print_report(report: dict) -> None:
    from memfit.interfaces.render.common import print_table

    rows = [(r, s["steps"], s["last_step"], s["device_kind"] or "?", _gib(s["peak_bytes"]), _gib(s["allocated_bytes"]),
             _gib(s["reserved_bytes"]), "-" if s["mean_tokens"] is None else f"{s['mean_tokens']:,.0f}",
             "-" if s["mean_step_seconds"] is None else f"{s['mean_step_seconds']:.3f}")
            for r, s in report["ranks"].items()]
    print_table("monitored run", ("rank", "steps", "last step", "device", "peak GiB", "allocated GiB",
                                  "reserved GiB", "tokens/step", "s/step"), rows)
    if not report["findings"]:
        print("no growth, imbalance or fragmentation found")
    vs = report.get("vs_estimate")
    if vs and not vs["available"]:
        print(f"vs memfit's estimate: {vs['why']}")
    available = vs if vs and vs["available"] else {}
    for basis, row in available.items():
        if isinstance(row, dict):
            print(f"vs memfit's estimate ({basis}, peak in {available['peak_phase']}): {_versus(row)}")
    for row in (vs or {}).get("by_phase", ()):
        print(f"  {row['phase']} (allocated peak of the phase): {_versus(row)}")
    for f in report["findings"]:
        print(describe(f))
        print("  likely causes: " + "; ".join(f["causes"]))
        print("  knobs: " + "; ".join(f["knobs"]))


def _versus(row: dict) -> str:
    word = "UNDER-predicted" if row["under_predicted"] else "covered"
    pct = "" if row["error_pct"] is None else f" ({row['error_pct']:+.1f}%)"
    return f"measured {_gib(row['measured_bytes'])} GiB, estimate {_gib(row['estimate_bytes'])} GiB{pct}: {word}"


def describe(f: dict) -> str:
    if f["kind"] == "growth":
        when = (f", reaches {_gib(f['capacity_bytes'])} GiB at step {f['reaches_capacity_at_step']}"
                if f["reaches_capacity_at_step"] is not None else "")
        t = "exact" if f["t"] is None else f"t={f['t']}"
        return (f"growth on rank {f['rank']}: {f['bytes_per_step'] / 2**20:,.3f} MiB per step ({f['series']}, "
                f"R^2={f['r2']}, {t}, {f['steps_fitted']} steps after {f['warmup_steps']} warm-up){when}")
    if f["kind"] == "imbalance":
        why = ("follows the ranks' tokens (correlation "
               f"{f['token_correlation']})" if f["follows_tokens"] else "does not follow the ranks' tokens")
        return (f"imbalance: rank {f['max_rank']} peaks {f['ratio']}x rank {f['min_rank']}; it {why}"
                + (f"; growing ranks {f['growing_ranks']}" if f["growing_ranks"] else ""))
    return (f"fragmentation on rank {f['rank']}: {_gib(f['slack_bytes'])} GiB reserved beyond the "
            f"{_gib(f['peak_allocated_bytes'])} GiB peak ({f['share']:.0%})")
