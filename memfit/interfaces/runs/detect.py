"""What a monitored run shows: steady growth per rank, imbalance across ranks (following the ranks' tokens or
not) and allocator fragmentation. Thresholds and the causes / knobs texts: memfit/facts/data/run_findings.toml.
Plain numbers in, plain dicts out (the memfit.watch/1 JSON document)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from memfit.facts.run_findings import finding, thresholds
from memfit.interfaces.runs.read import Sample

WATCH_SCHEMA = "memfit.watch/1"


@dataclass
class Fit:
    slope: float
    intercept: float
    r2: float
    t: float  # slope / its standard error; inf for an exact line
    n: int


def fit_line(xs: list[float], ys: list[float]) -> Fit | None:
    """Ordinary least squares y = a + b x."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    sse = max(syy - slope * slope * sxx, 0.0)
    r2 = 1.0 - sse / syy if syy > 0 else 0.0
    se = math.sqrt(sse / (n - 2) / sxx)
    t = slope / se if se > 0 else (math.inf if slope else 0.0)
    return Fit(slope, my - slope * mx, r2, t, n)


def warmup(n: int) -> int:
    th = thresholds()
    return max(th["growth_warmup_steps"], math.ceil(th["growth_warmup_share"] * n))


def growth(rank: int, samples: list[Sample], capacity: int | None) -> dict | None:
    """The steepest significant straight-line growth of what a step leaves behind (allocated at its end: the
    leak itself, and on the CPU the only exact series) or of its peak."""
    th = thresholds()
    fitted = samples[warmup(len(samples)):]
    best = None
    for series in ("allocated", "peak"):
        pts = [(s.step, getattr(s, series)) for s in fitted if getattr(s, series) is not None]
        f = fit_line([p[0] for p in pts], [p[1] for p in pts]) if len(pts) >= th["growth_min_points"] else None
        if (f and f.slope >= th["growth_min_bytes_per_step"] and f.r2 >= th["growth_min_r2"]
                and f.t >= th["growth_min_t"] and (best is None or f.t > best[1].t)):
            best = (series, f, pts[0][0], pts[-1][0])
    if best is None:
        return None
    series, f, first, end = best
    last = samples[-1]
    out = {"kind": "growth", "rank": rank, "series": series, "bytes_per_step": round(f.slope, 1),
           "r2": round(f.r2, 4), "t": None if math.isinf(f.t) else round(f.t, 1), "steps_fitted": f.n,
           "warmup_steps": len(samples) - len(fitted), "capacity_bytes": capacity, "steps_to_capacity": None,
           "reaches_capacity_at_step": None,
           # the fitted line at the first and last fitted steps ([step, bytes]): what the HTML page draws
           "fitted_line": [[s, round(f.intercept + f.slope * s)] for s in (first, end)], "projection": None}
    if capacity and last.peak is not None:
        left = max(0.0, (capacity - last.peak) / f.slope)
        out.update(steps_to_capacity=math.ceil(left), reaches_capacity_at_step=last.step + math.ceil(left),
                   projection=[[last.step, last.peak], [last.step + math.ceil(left), capacity]])
    return {**out, **finding("growth")}


def pearson(xs: list[float], ys: list[float]) -> float | None:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy)


def imbalance(ranks: dict[int, list[Sample]], growing: list[int]) -> dict | None:
    """max / min of the ranks' peaks; it follows the tokens when the ranks' token counts differ and the
    peaks rise with them (long samples), else it is something one rank keeps (a rank-specific leak)."""
    th = thresholds()
    peaks = {r: max(s.peak for s in ss if s.peak is not None) for r, ss in ranks.items()
             if any(s.peak is not None for s in ss)}
    if len(peaks) < 2 or min(peaks.values()) <= 0:
        return None
    hi, lo = max(peaks, key=peaks.__getitem__), min(peaks, key=peaks.__getitem__)
    ratio = peaks[hi] / peaks[lo]
    if ratio < th["imbalance_min_ratio"]:
        return None
    tokens = {r: _mean([s.tokens for s in ranks[r] if s.tokens is not None]) for r in peaks}
    known = {r: v for r, v in tokens.items() if v is not None}
    corr = None
    if len(known) == len(tokens) and max(known.values()) >= th["imbalance_min_token_ratio"] * max(
            min(known.values()), 1e-9):
        corr = pearson([peaks[r] for r in peaks], [known[r] for r in peaks])
    follows = corr is not None and corr >= th["imbalance_min_correlation"]
    texts = finding("imbalance_tokens" if follows else "imbalance_leak")
    return {"kind": "imbalance", "ratio": round(ratio, 3), "max_rank": hi, "min_rank": lo,
            "peaks": {str(r): v for r, v in peaks.items()},
            "tokens": {str(r): None if v is None else round(v, 1) for r, v in tokens.items()},
            "token_correlation": None if corr is None else round(corr, 3), "follows_tokens": follows,
            "growing_ranks": [r for r in growing if r in peaks], **texts}


def fragmentation(ranks: dict[int, list[Sample]]) -> dict | None:
    """Reserved beyond the step's allocated peak at the last step: cache the allocator holds but could not
    use for that peak. The worst rank, with every rank over the thresholds listed."""
    th = thresholds()
    over = []
    for r, ss in ranks.items():
        last = _last_cache(ss)
        if last is None:
            continue
        s, reserved, used = last
        slack = reserved - used
        if slack >= th["fragmentation_min_bytes"] and slack / used >= th["fragmentation_min_share"]:
            over.append((slack / used, r, s, slack, used))
    if not over:
        return None
    share, r, s, slack, used = max(over)
    return {"kind": "fragmentation", "rank": r, "step": s.step, "reserved_bytes": s.reserved,
            "peak_allocated_bytes": used, "slack_bytes": slack, "share": round(share, 3),
            "ranks": sorted(x[1] for x in over), **finding("fragmentation")}


def _last_cache(ss: list[Sample]) -> tuple[Sample, int, int] | None:
    """The last sample that has reserved bytes and a nonzero allocated peak (or allocated, where no peak was
    read or it reads 0, as after a reset of the peak): (that sample, its reserved bytes, its allocated bytes)."""
    for s in reversed(ss):
        used = s.peak_allocated or s.allocated
        if s.reserved is not None and used:
            return s, s.reserved, used
    return None


def rank_summary(ss: list[Sample]) -> dict:
    last = ss[-1]
    peaks = [s.peak for s in ss if s.peak is not None]
    return {"steps": len(ss), "first_step": ss[0].step, "last_step": last.step, "device_kind": last.device_kind,
            "peak_bytes": max(peaks) if peaks else None, "allocated_bytes": last.allocated,
            "reserved_bytes": last.reserved, "device_total_bytes": last.device_total,
            "host_rss_bytes": last.host_rss, "mean_tokens": _mean([s.tokens for s in ss if s.tokens is not None]),
            "mean_step_seconds": _mean([s.step_seconds for s in ss if s.step_seconds is not None])}


def vs_estimate(ranks: dict[int, list[Sample]], e) -> dict:
    """The run's peak beside memfit's estimate of it: the allocator's peak against the estimate's allocated peak,
    and the driver's used bytes against its device total (both CUDA figures: a CPU run has neither)."""
    samples = [s for ss in ranks.values() for s in ss]
    peaks = [s.peak_allocated for s in samples if s.peak_allocated is not None]
    if not peaks:
        return {"available": False, "why": "the lines have no allocator peak (a CPU run): nothing on the device "
                                           "to compare with the estimate"}
    out = {"available": True, "peak_phase": e.allocated.peak_phase,
           "allocated": _against(e.allocated.peak.total, max(peaks))}
    used = [s.device_used for s in samples if s.device_used is not None]
    if used:
        out["device_total"] = _against(e.device_total.peak.total, max(used))
    by_phase = _by_phase([s for s in samples if s.peak_allocated is not None], e.allocated.phases)
    if by_phase:
        out["by_phase"] = by_phase
    return out


def _by_phase(samples: list[Sample], estimated: dict) -> list[dict]:
    """Each phase both the run marked and the estimate has, in the estimate's order: its highest peak over ranks
    and steps against the estimate's allocated bytes at that phase's peak. A list of rows (not a dict beside
    `allocated`): readers of vs_estimate take its dict values as the overall comparisons."""
    measured: dict[str, int] = {}
    for s in samples:
        for name, peak in (s.phase_peaks or {}).items():
            measured[name] = max(measured.get(name, 0), peak)
    return [{"phase": name, **_against(b.total, measured[name])} for name, b in estimated.items() if name in measured]


def _against(estimate: int, measured: int) -> dict:
    return {"estimate_bytes": estimate, "measured_bytes": measured,  # a measured 0 (an empty phase): no error %
            "error_pct": round(100.0 * (estimate - measured) / measured, 2) if measured else None,
            "under_predicted": measured > estimate}


def watch_report(ranks: dict[int, list[Sample]], capacity: int | None = None, estimate=None) -> dict:
    """The memfit.watch/1 document. Without a capacity given, each rank's device total from its lines; with
    memfit's `estimate` of the run, the measured peak beside it."""
    findings = []
    for r, ss in ranks.items():
        g = growth(r, ss, capacity or ss[-1].device_total)
        if g:
            findings.append(g)
    imb = imbalance(ranks, [f["rank"] for f in findings])
    frag = fragmentation(ranks)
    findings += [f for f in (imb, frag) if f]
    return {"schema": WATCH_SCHEMA, "steps": max((len(ss) for ss in ranks.values()), default=0),
            "ranks": {str(r): rank_summary(ss) for r, ss in ranks.items()},
            **_headline([f for f in findings if f["kind"] == "growth"], imb, frag), "findings": findings,
            "vs_estimate": None if estimate is None else vs_estimate(ranks, estimate)}


def _headline(growths: list[dict], imb: dict | None, frag: dict | None) -> dict:
    """The issue's summary keys: the fastest leak, and whether imbalance and fragmentation were found (their
    numbers are the findings' own)."""
    worst = max(growths, key=lambda g: g["bytes_per_step"], default=None)
    leak = {"detected": worst is not None, "bytes_per_step": worst and worst["bytes_per_step"],
            "rank": worst and worst["rank"],
            "steps_to_capacity": worst and worst["steps_to_capacity"]}
    return {"leak": leak, "imbalance": {"detected": imb is not None, **(imb or {})},
            "fragmentation": {"detected": frag is not None, **(frag or {})}}


def _mean(xs: list) -> float | None:
    return sum(xs) / len(xs) if xs else None
