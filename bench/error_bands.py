"""Write (or check) memfit/facts/data/error_bands.toml: the error band of each kind of run, from the benches.

    python bench/error_bands.py            # print the bands
    python bench/error_bands.py --write    # write the table
    python bench/error_bands.py --check    # exit 1 when the table disagrees with the bench files

A band is the share of the estimated device total by which a real run may exceed the estimate:
- measured: the 95th percentile (nearest rank) of the trace rows' under-prediction (trace / estimate - 1) for
  the kind's tuning (bench/accuracy.py's grid: the real transformers/PEFT step on fake tensors, one GPU, from
  bench/trace_cache.json), plus the same over the engine rows of the kind's engine family (bench/engine.py's
  rows: the real DeepSpeed / FSDP / DDP engine on 2 gloo ranks, from bench/engine_measured.json, its --save; and
  bench/accelerate_fsdp.py's rows, HF Trainer's FSDP1 / FSDP2 through accelerate, from bench/accelerate_fsdp.json);
  a single GPU adds no engine part (the trace is its whole step). Both compare with the estimator as it is
  now, so a change of the estimate that moves a bench error fails --check until the table is rewritten. Over-predictions count as negative errors; a quantile below zero counts as zero. Both benches compare
  allocated bytes; relative to the larger device total the same bytes are a smaller share, so using them as
  shares of the device total errs high.
- allowance: what neither bench can see (memfit/facts/data/error_allowances.toml), assumed.
A kind is written only when it is measured: trace rows for its tuning and, beyond one GPU, engine rows for its
family and tuning. Others borrow the widest band at run time (memfit/facts/error_bands.py).
The published cases (../shared/cases) are a check of these bands (bench/published.py), never an input.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from memfit.facts.adapters import trains_adapters  # noqa: E402
from memfit.facts.error_bands import TABLE, family_of, tuning_group  # noqa: E402

QUANTILE = 0.95
TRACE = ROOT / "bench" / "trace_cache.json"
ENGINE = ROOT / "bench" / "engine_measured.json"
ACCELERATE = ROOT / "bench" / "accelerate_fsdp.json"  # HF Trainer's FSDP1 / FSDP2 through accelerate, 2 gloo ranks
ALLOWANCES = TABLE.parent / "error_allowances.toml"


def quantile(values: list[float], q: float = QUANTILE) -> float:
    """Nearest rank: the smallest value with at least q of the values at or below it (with few rows, the max)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def under(estimate: float, real: float) -> float:
    """How much the real run exceeds the estimate, as a share of the estimate (negative: over-predicted)."""
    return real / estimate - 1.0


def trace_doc() -> dict:
    """bench/accuracy.py's rows, compared from the trace cache (no tracing)."""
    import accuracy

    comparisons = accuracy.evaluate(accuracy.all_rows(), accuracy.TraceCache(TRACE))
    return {"rows": [c.to_json() for c in comparisons]}


def engine_doc() -> dict:
    """bench/engine.py's rows: the saved measurements against the estimate of the same scenarios."""
    import engine
    from memfit.measure.result import MeasureResult

    saved = json.loads(ENGINE.read_text())
    scenarios = engine.rows(quick=False)
    if len(saved) != len(scenarios):
        raise SystemExit(f"{ENGINE.name} holds {len(saved)} rows, bench/engine.py has {len(scenarios)}: "
                         f"re-measure with python bench/engine.py --save {ENGINE.relative_to(ROOT)}")
    rows = [engine.compare(s, MeasureResult.from_json(r)) for s, r in zip(scenarios, saved)]
    return {"rows": rows + accelerate_rows()}


def accelerate_rows() -> list[dict]:
    """bench/accelerate_fsdp.py's saved rows against the estimate, labelled as engine rows ("fsdp1 accelerate")."""
    import accelerate_fsdp

    saved = json.loads(ACCELERATE.read_text())["rows"]
    return [{"config": f"fsdp{accelerate_fsdp.ROWS[name]['fsdp_version']} accelerate",
             "tuning": accelerate_fsdp.ROWS[name]["tuning"], **accelerate_fsdp.compare(name, measured)}
            for name, measured in saved.items()]


def trace_rows(doc: dict) -> dict[str, list[float]]:
    """Under-predictions per tuning group. A comparison's error_pct = (estimate - trace) / trace."""
    groups: dict[str, list[float]] = {}
    for r in doc["rows"]:
        if r.get("status") != "ok":
            continue
        tuning = r["knobs"]["tuning"]
        e = r["total_peak"]["error_pct"] / 100.0
        groups.setdefault(tuning_group(tuning, trains_adapters(tuning), False), []).append(under(1.0, 1.0 / (1.0 + e)))
    return groups


def engine_family(config: str) -> str:
    """The family of an engine row from bench/engine.py's label ("z2", "z3 off", "dpo z3", "ddp", "fsdp2 ...")."""
    first = config.removeprefix("dpo ").split()[0]
    if first.startswith("z") and first[1:].isdigit():
        return family_of("deepspeed", int(first[1:]))
    return "fsdp" if first.startswith("fsdp") else first


def engine_rows(doc: dict) -> dict[str, list[float]]:
    """Under-predictions per FAMILY/TUNING kind."""
    kinds: dict[str, list[float]] = {}
    for r in doc["rows"]:
        if "estimate" not in r:
            continue
        kind = f"{engine_family(r['config'])}/{tuning_group(r['tuning'], trains_adapters(r['tuning']), False)}"
        kinds.setdefault(kind, []).append(under(r["estimate"], r["measured"]))
    return kinds


def file_date(path: Path) -> str:
    """When the bench file was made: its last commit's date when unchanged since, else today."""
    rel = str(path.relative_to(ROOT))
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--", rel], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
        date = subprocess.run(["git", "log", "-1", "--format=%cs", "--", rel], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        dirty, date = "?", ""
    return date if date and not dirty else datetime.date.today().isoformat()


def _num(x: float) -> str:
    return f"{round(x, 4):.4f}"


def _list(values: list[float]) -> str:
    items = [_num(v) for v in sorted(values)]
    lines = [", ".join(items[i:i + 12]) for i in range(0, len(items), 12)]
    return "[\n  " + ",\n  ".join(lines) + ",\n]"


def render(dates: dict[str, str] | None = None) -> str:
    """The table's text. `dates` (source -> date) pins the dates, so --check compares numbers, not calendars."""
    with open(ALLOWANCES, "rb") as f:
        families = tomllib.load(f)["family"]
    dates = dates or {"trace": file_date(TRACE), "engine": max(file_date(ENGINE), file_date(ACCELERATE))}
    trace, engine = trace_rows(trace_doc()), engine_rows(engine_doc())
    trace_src = f"{TRACE.relative_to(ROOT)} {dates['trace']}"
    engine_src = f"{ENGINE.relative_to(ROOT)} + {ACCELERATE.name} {dates['engine']}"
    out = [
        "# Error bands: the share of memfit's estimated device total by which a real run may exceed it, per kind",
        "# of run (FAMILY/TUNING). WRITTEN BY `python bench/error_bands.py --write`; `--check` fails when it",
        "# disagrees with the bench files. Do not edit: change the benches or data/error_allowances.toml.",
        "# band = measured + allowance. measured: the 95th percentile (nearest rank) of the trace rows'",
        "# under-prediction (trace / estimate - 1) for the tuning, plus that of the engine rows of the family",
        "# (none for one GPU); allowance: error_allowances.toml, assumed. memfit/facts/error_bands.py reads it.",
        f'basis = "device_total"\nquantile = {QUANTILE}\n',
        "[source.trace]",
        'what = "the analytic estimate vs a fake-tensor trace of the real transformers/PEFT step (one GPU, allocated)"',
        f'path = "{TRACE.relative_to(ROOT)}"\ndate = "{dates["trace"]}"\nrows = {sum(map(len, trace.values()))}\n',
        "[source.engine]",
        'what = "the estimate vs the real DeepSpeed / FSDP / DDP engine and HF Trainer\'s FSDP through accelerate, 2 gloo '
        'ranks on the CPU (allocated)"',
        f'path = "{ENGINE.relative_to(ROOT)}, {ACCELERATE.relative_to(ROOT)}"\ndate = "{dates["engine"]}"\n'
        f'rows = {sum(map(len, engine.values()))}\n',
    ]
    for group, values in sorted(trace.items()):
        out += [f"[trace.{group}]  # {trace_src}", f"rows = {len(values)}",
                f"p95 = {_num(quantile(values))}", f"under = {_list(values)}\n"]
    for family, parts in families.items():
        allowance = parts["fragmentation"] + parts["nccl"] + parts["libraries"]
        for group, values in sorted(trace.items()):
            kind = f"{family}/{group}"
            if family != "single" and kind not in engine:
                continue  # not measured on its engine: borrows the widest band at run time
            t = max(0.0, quantile(values))
            e = max(0.0, quantile(engine[kind])) if family != "single" else 0.0
            e_note = (f"p95 of {len(engine[kind])} engine row(s), {engine_src}" if family != "single"
                      else "one GPU: the trace is the whole step")
            out += [f'[band."{kind}"]',
                    f'trace = "{group}"',
                    f"trace_p95 = {_num(t)}  # p95 of {len(values)} trace rows, {trace_src}",
                    f"engine = {_num(e)}  # {e_note}",
                    f"measured = {_num(t + e)}",
                    f"allowance = {_num(allowance)}  # assumed: error_allowances.toml [family.{family}]",
                    f"band = {_num(t + e + allowance)}\n"]
    return "\n".join(out)


def recorded_dates() -> dict[str, str] | None:
    if not TABLE.exists():
        return None
    with open(TABLE, "rb") as f:
        src = tomllib.load(f).get("source", {})
    return {k: v["date"] for k, v in src.items()} if {"trace", "engine"} <= set(src) else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="write memfit/facts/data/error_bands.toml")
    p.add_argument("--check", action="store_true", help="exit 1 when the table differs from the bench files")
    a = p.parse_args(argv)
    if a.check:
        same = TABLE.exists() and TABLE.read_text() == render(recorded_dates())
        print(f"{TABLE.name} agrees with the bench files" if same else
              f"{TABLE.name} disagrees with the bench files: run python bench/error_bands.py --write")
        return 0 if same else 1
    text = render()
    if a.write:
        TABLE.write_text(text)
        print(f"wrote {TABLE}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
