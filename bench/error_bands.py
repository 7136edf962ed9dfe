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

The CPU benches cannot see what only a GPU run holds (the caching allocator, the CUDA context, NCCL, kernels'
workspaces), so each kind also gets a band from real GPU runs (bench/real_runs.py: our H200 rows, the published
measurements and the user reports of cases/), measured as coverage. The real rows are split in two by a
hash of their configuration; on one part the band is set as the narrowest FLOOR + FRACTION x estimate that covers
95% of its rows' excess over the estimate (a floor because what a GPU run adds is partly a fixed amount: the
context and library workspaces); the other part reports how many of its rows land outside. A kind with fewer than
10 real rows says so and takes the widest measured real band of its tuning (a LoRA run does not carry
bitsandbytes' uncertainty), or the widest of all when its tuning has none measured. A verdict needs the larger of the two bands: real
runs can only widen a band, and no band ever moves an estimate.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
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
REAL_MIN_ROWS = 10  # a kind with fewer real rows takes the widest measured real band
FLOOR_STEP = 2**28  # the real band's floor is searched in quarter-GiB steps
GIB = 2**30


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


def real_band(rows: list, q: float = QUANTILE) -> tuple[int, float]:
    """(floor bytes, fraction): of the pairs under which q of `rows` have excess <= floor + fraction x estimate,
    the one whose margin, summed over the rows memfit under-predicted, is least (a row memfit over-predicted is
    held by any band: its size must not decide the band's shape)."""
    best = None
    under = [r for r in rows if r.excess > 0] or rows
    top = max(0, max(r.excess for r in rows))
    for floor in range(0, top + FLOOR_STEP, FLOOR_STEP):
        fraction = max(0.0, math.ceil(quantile([(r.excess - floor) / r.estimate for r in rows], q) * 1e4) / 1e4)
        cost = sum(floor + fraction * r.estimate for r in under)
        if best is None or cost < best[0]:
            best = (cost, floor, fraction)
    return best[1], best[2]


def covered(row, floor: int, fraction: float, cpu_fraction: float) -> bool:
    """Whether the band a verdict would use holds this real run's excess."""
    return row.excess <= max(cpu_fraction * row.estimate, floor + fraction * row.estimate)


def real_kinds(cpu_bands: dict[str, float]) -> dict[str, dict]:
    """Per kind with enough real rows: its band set on the fit part and its coverage of the held-out part; the
    kinds with fewer rows take the widest (the largest floor and fraction of the measured kinds)."""
    import real_runs

    by_kind: dict[str, list] = {}
    rows_all = real_runs.real_rows()
    part = real_runs.split(rows_all)
    for r in rows_all:
        by_kind.setdefault(r.kind, []).append(r)
    out = {}
    for kind, rows in sorted(by_kind.items()):
        fit = [r for r in rows if part[kind, r.group] == "fit"]
        held = [r for r in rows if part[kind, r.group] == "held_out"]
        entry = {"rows": len(rows), "fit_rows": len(fit), "held_out": len(held), "rows_list": rows, "fit": fit,
                 "held": held}
        if len(rows) >= REAL_MIN_ROWS and fit and held:
            entry["floor"], entry["fraction"] = real_band(fit)
        out[kind] = entry
    measured = {k: e for k, e in out.items() if "floor" in e}
    reference = statistics.median(r.estimate for e in out.values() for r in e["rows_list"])
    out["widest"] = _widest(measured, reference)
    # a kind with too few runs takes the widest band of its own tuning where one is measured (a LoRA run does not
    # carry bitsandbytes' uncertainty), else the widest of all
    for tuning in sorted({k.split("/")[-1] for k in out if k != "widest"}):
        same = {k: e for k, e in measured.items() if k.split("/")[-1] == tuning}
        if same:
            out[f"widest/{tuning}"] = _widest(same, reference)
    for kind, e in out.items():
        if "floor" not in e:
            wide = out.get(f"widest/{kind.split('/')[-1]}", out["widest"])
            e["floor"], e["fraction"], e["stands_in"] = wide["floor"], wide["fraction"], wide["of"]
        cpu = cpu_bands.get(kind, max(cpu_bands.values(), default=0.0))
        e["outside"] = sum(not covered(r, e["floor"], e["fraction"], cpu) for r in e.get("held", ()))
    return out


def _widest(measured: dict[str, dict], reference: float) -> dict:
    """The measured band with the largest margin at the real runs' median estimate."""
    of = max(measured, key=lambda k: measured[k]["floor"] + measured[k]["fraction"] * reference, default="")
    floor, fraction = (measured[of]["floor"], measured[of]["fraction"]) if of else (0, 0.0)
    return {"rows": 0, "fit_rows": 0, "held_out": 0, "rows_list": [], "held": [], "floor": floor,
            "fraction": fraction, "of": of}


def _real_section(kinds: dict[str, dict]) -> list[str]:
    import real_runs

    digest = real_runs.sources_digest()
    total = sum(e["rows"] for e in kinds.values())
    out = ["[source.real]",
           'what = "real GPU runs (bench/real_runs.py): bench/cuda_h200.json when measured, cases/'
           'published.jsonl and cases/user-reports.jsonl; excess = measured - estimate on what each measured"',
           f'sha256 = "{digest}"  # of the case files read\nrows = {total}\nmin_rows = {REAL_MIN_ROWS}',
           'split = "per kind, each model\'s configurations (model, GPUs, method, micro-batch, length, engine) in '
           'sha256 order, alternately on each side: the band is set on the fit part, the held_out part reports how '
           'many of its rows land outside"\n']
    wide = kinds.pop("widest")
    by_tuning = {k.split("/", 1)[1]: kinds.pop(k)["of"] for k in [k for k in kinds if k.startswith("widest/")]}
    out += ["[real_widest]  # what a kind with fewer real rows, or none, takes when its tuning has no measured kind",
            f'kind = "{wide["of"]}"', f"floor_gib = {wide['floor'] / GIB:.2f}", f"fraction = {_num(wide['fraction'])}\n",
            "[real_widest_of]  # per tuning: the measured kind whose band the tuning's kinds with too few rows take",
            *(f'{t} = "{k}"' for t, k in sorted(by_tuning.items())), ""]
    for kind, e in kinds.items():
        rel = [r.relative for r in e["rows_list"]]
        note = (f"  # fewer than {REAL_MIN_ROWS} real rows: {e['stands_in']}'s band, the widest measured of its tuning "
                f"(the largest margin at the real runs' median estimate)" if e.get("stands_in") else "")
        out += [f'[real."{kind}"]', f"rows = {e['rows']}", f"fit_rows = {e['fit_rows']}",
                f"held_out = {e['held_out']}", f"held_out_outside = {e['outside']}",
                f"floor_gib = {e['floor'] / GIB:.2f}{note}", f"fraction = {_num(e['fraction'])}",
                f'stands_in = "{e.get("stands_in") or ""}"',
                f"relative = {_list(rel)}\n"]
    return out


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
    cpu_bands: dict[str, float] = {}
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
            cpu_bands[kind] = round(t + e + allowance, 4)
    return "\n".join(out + _real_section(real_kinds(cpu_bands)))


def recorded_dates() -> dict[str, str] | None:
    if not TABLE.exists():
        return None
    with open(TABLE, "rb") as f:
        src = tomllib.load(f).get("source", {})
    return {k: src[k]["date"] for k in ("trace", "engine")} if {"trace", "engine"} <= set(src) else None


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
