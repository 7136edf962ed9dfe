"""What a parsed log means: findings from the failure's own figures (fragmentation, other processes on the GPU,
a request larger than the GPU, what killed a host process), DeepSpeed's timeline, and with the run's config
memfit's estimate beside what the log proves and the fixes, ranked.

Fixes: first what the log itself prescribes (the allocator setting, freeing the GPU, /dev/shm), then one-knob
changes of the planner's search space that make the run fit by memfit's estimate and free at least what the
log shows was missing, fastest first (one change is the smallest edit that fixes the failure), then the
planner's fastest full plans (memfit/planner/plan.py plan()). Without a config (or when the planner finds
none), the generic fixes for the failure's phase instead (advice.py, memfit/facts/data/log_fixes.toml)."""
from __future__ import annotations

from dataclasses import dataclass, field

from memfit.interfaces.logs.advice import generic_fixes, headline
from memfit.interfaces.logs.parse import Failure, LogReport, TimelinePoint
from memfit.interfaces.logs.sites import thresholds

GiB = 2**30
TOP_PLANS = 3
EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
DISTINCT_VALUES = ("sharding", "tuning")  # knobs whose values are different approaches, not degrees of one
GPU_MISMATCH_SHARE = 0.03  # the log's total capacity vs the config's GPU: beyond this they are not the same card


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GiB:,.2f} GiB"


@dataclass
class Diagnosis:
    failures: list[Failure]
    findings: list[dict] = field(default_factory=list)
    fixes: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"schema": "memfit.doctor/1", "failures": [f.to_json() for f in self.failures],
                "findings": self.findings, "fixes": self.fixes}


def finding(kind: str, text: str, **data) -> dict:
    return {"kind": kind, "text": text, **data}


def diagnose(report: LogReport, scenario=None) -> Diagnosis:
    d = Diagnosis(report.failures)
    for f in report.failures:
        d.findings += failure_findings(f)
        d.fixes += log_fixes(f)
    d.findings += timeline_findings(report.timeline)
    main = primary(report.failures)
    if scenario is not None:
        d.findings += estimate_findings(main, scenario, report.timeline)
        d.fixes += config_fixes(scenario, main)
    if main is not None and not any(fx["from"] == "planner" for fx in d.fixes):
        d.fixes += generic_fixes(main)  # what the log alone says to try; a config ranks memfit's own instead
    d.fixes = [dict(fx, rank=i) for i, fx in enumerate(unique_fixes(d.fixes), 1)]
    return d


def primary(failures: list[Failure]) -> Failure | None:
    """The failure the fixes are for: the first with the most figures (one OOM printed by several ranks)."""
    if not failures:
        return None
    return max(failures, key=lambda f: sum(v is not None for v in f.to_json().values()))


# ---------------------------------------------------------------- from the log alone

def failure_findings(f: Failure) -> list[dict]:
    """The failure's answer (advice.headline, the first line doctor prints) and what its figures show."""
    out = [finding(f.kind, headline(f), line=f.line, phase=f.phase, component=f.component)]
    if f.kind == "cuda_oom" and f.total_bytes is not None:
        out += _cuda_findings(f)
    elif f.kind == "host_oom" and f.form == "sigkill":
        out.append(finding("sigkill", "a process killed by SIGKILL prints nothing; on Linux that is the kernel's "
                           "OOM killer when host RAM runs out (`dmesg | grep -i 'killed process'` confirms)"))
    return out


def _cuda_findings(f: Failure) -> list[dict]:
    gpu = "GPU" + (f" {f.gpu}" if f.gpu is not None else "")
    out = []
    if f.fragmentation:
        out.append(finding("fragmentation", f"{gib(f.reserved_unallocated_bytes)} is reserved by PyTorch but "
                           f"unallocated, at least the {gib(f.tried_to_allocate_bytes)} asked for: the memory is "
                           "there but cut into pieces; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets the "
                           "allocator grow segments instead"))
    if (f.other_processes_bytes or 0) >= thresholds()["other_processes_min_bytes"]:
        out.append(finding("other_processes", f"{gib(f.other_processes_bytes)} of {gpu} is held by other "
                           "processes (total - free - this process): another job or a stale process shares the GPU"))
    if f.tried_to_allocate_bytes and f.total_bytes is not None and f.tried_to_allocate_bytes > f.total_bytes:
        out.append(finding("request_exceeds_gpu", f"one tensor of {gib(f.tried_to_allocate_bytes)} is larger than "
                           f"the whole GPU ({gib(f.total_bytes)}): no allocator setting helps, the shapes must shrink"))
    elif f.free_bytes is not None and f.tried_to_allocate_bytes and f.free_bytes >= f.tried_to_allocate_bytes:
        out.append(finding("free_exceeds_request", f"{gib(f.free_bytes)} was free, more than asked for: the free "
                           "memory was not in one piece, or another process took it between the two"))
    return out


def timeline_findings(points: list[TimelinePoint]) -> list[dict]:
    out = []
    gpu = [(p.max_allocated_bytes, p) for p in points if p.max_allocated_bytes is not None]
    if gpu:
        peak, top = max(gpu, key=lambda pair: pair[0])
        out.append(finding("timeline", f"DeepSpeed's see_memory_usage ({len(points)} reports): peak "
                           f"{gib(peak)} allocated (Max_MA) at '{top.label}', "
                           f"{gib(max(p.reserved_bytes or 0 for _, p in gpu))} reserved (CA) at most",
                           peak_allocated_bytes=peak, label=top.label))
    host = [(p.host_used_bytes, p) for p in points if p.host_used_bytes is not None]
    if host:
        used, top = max(host, key=lambda pair: pair[0])
        node = int(used * 100 / top.host_percent) if top.host_percent else None
        last = host[-1][1]
        out.append(finding("timeline_host", f"host RAM used {gib(used)} ({top.host_percent:g}% of "
                           f"the node, so about {gib(node)} in all) at '{top.label}', the last report "
                           f"'{last.label}' at {last.host_percent:g}%",
                           peak_host_bytes=used, node_bytes=node, label=top.label))
    return out


def log_fixes(f: Failure) -> list[dict]:
    out: list[dict] = []
    if f.fragmentation:
        out.append({"fix": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "from": "log", "changes": [],
                    "env": EXPANDABLE, "why": "the request fits in what PyTorch already reserved, but not in one piece"})
    if f.kind == "cuda_oom" and (f.other_processes_bytes or 0) >= thresholds()["other_processes_min_bytes"]:
        out.append({"fix": f"free GPU {f.gpu if f.gpu is not None else ''} of the other processes holding "
                           f"{gib(f.other_processes_bytes)} (nvidia-smi), or choose idle GPUs with CUDA_VISIBLE_DEVICES",
                    "from": "log", "changes": [], "env": None, "why": "another process holds memory on this GPU"})
    if f.form == "nccl-shm":
        out.append({"fix": "give /dev/shm more room (docker run --shm-size=16g, or --ipc=host), or NCCL_SHM_DISABLE=1",
                    "from": "log", "changes": [], "env": None, "why": "NCCL could not create its shared-memory segment"})
    return out


def unique_fixes(fixes: list[dict]) -> list[dict]:
    seen, out = set(), []
    for fx in fixes:
        if fx["fix"] not in seen:
            seen.add(fx["fix"])
            out.append(fx)
    return out


# ---------------------------------------------------------------- with the run's config

def reconcile_capacity(scenario, f: Failure | None):
    """The scenario with its GPU's capacity as the log reports it, and the finding that says so; unchanged (and
    no finding) when the log gives no total or names another card (estimate_findings says that one). The
    catalog's figure is one reading of torch's total_memory; OOM messages on the same card can show a few
    hundred MiB less (gpus.toml: 23.65-23.68 GiB for the RTX 4090's 23.99): the run failed against its own."""
    from dataclasses import replace

    if f is None or f.kind != "cuda_oom" or not f.total_bytes:
        return scenario, None
    hw = scenario.hardware
    card = hw.gpu.memory_bytes
    if f.total_bytes == card or abs(f.total_bytes - card) > GPU_MISMATCH_SHARE * card:
        return scenario, None
    gpu = replace(hw.gpu, memory_bytes=f.total_bytes)  # same card (its speed facts), the run's capacity
    note = finding("capacity", f"the card's capacity is taken from the log: {gib(f.total_bytes)} total capacity "
                   f"(memfit's catalog has {gib(card)} for {hw.gpu.name})", log_bytes=f.total_bytes,
                   catalog_bytes=card)
    return replace(scenario, hardware=replace(hw, gpu=gpu)), note


def estimate_findings(f: Failure | None, scenario, timeline: list[TimelinePoint]) -> list[dict]:
    from memfit.roles.estimate import estimate

    e = estimate(scenario)
    gpu = scenario.hardware.gpu
    out = []
    if f is not None and f.total_bytes and f.kind == "cuda_oom" and \
            abs(f.total_bytes - gpu.memory_bytes) > GPU_MISMATCH_SHARE * gpu.memory_bytes:
        out.append(finding("gpu_mismatch", f"the log's GPU has {gib(f.total_bytes)} in all; the config's {gpu.name} "
                           f"has {gib(gpu.memory_bytes)} usable: give the GPU the log ran on (--gpu, or --gpu-mem)"))
    phase = f.phase if f is not None and f.phase in e.allocated.phases else e.peak_phase
    said = "at" if f is not None and f.phase == phase else "at its peak phase,"
    if f is not None and f.kind == "cuda_oom" and f.allocated_bytes is not None:
        need = f.allocated_bytes + (f.tried_to_allocate_bytes or 0)
        est = e.allocated.phases[phase].total
        far = abs(est - f.allocated_bytes) > thresholds()["estimate_far_share"] * max(f.allocated_bytes, 1)
        out.append(finding("estimate", f"the log shows {gib(f.allocated_bytes)} allocated {said} {phase} and a "
                           f"request for {gib(f.tried_to_allocate_bytes)} more ({gib(need)} needed); memfit estimates "
                           f"{gib(est)} allocated at {phase}" + (" (far from the log: see the findings above)" if far
                                                                 else ""),
                           log_allocated_bytes=f.allocated_bytes, memfit_allocated_bytes=est, phase=phase))
    elif f is not None and f.kind == "host_oom":
        host = e.host.phases[phase].total if phase in e.host.phases else e.host.peak.total
        ram = scenario.hardware.host_ram
        out.append(finding("estimate", f"the log shows the host process killed {said} {phase}; memfit estimates "
                           f"{gib(host)} host RAM per node at {phase} (peak {gib(e.host.peak.total)} at "
                           f"{e.host.peak_phase}) against " + (gib(ram) if ram else "an unknown host RAM (--host-ram)"),
                           memfit_host_bytes=host, phase=phase))
    out.append(finding("verdict", f"memfit's verdict for this config: {e.verdict} (device peak "
                       f"{gib(e.device_total.peak.total)} at {e.peak_phase} of {gib(gpu.memory_bytes)})"
                       + (": the log proves it does not fit; what memfit cannot see here (other processes, "
                          "fragmentation, the longest sample) made the difference" if e.verdict == "fits" and f else ""),
                       verdict=e.verdict))
    return out


def config_fixes(base, f: Failure | None) -> list[dict]:
    """One-knob changes that fix the failure, fastest first, then the planner's plans."""
    from memfit.planner.plan import plan
    from memfit.planner.space import Options

    if f is None:
        return []
    options = Options(resume=f.phase == "resume" if f.phase else True)
    singles = single_changes(base, f, options)
    single_sets = {_change_set(s) for s in singles}
    plans = [plan_fix(r) for r in plan(base, set(), None, top_k=TOP_PLANS, options=options)
             if r.changes and frees_enough(f, base, r.scenario)]
    return singles + [p for p in plans if _change_set(p) not in single_sets]


def single_changes(base, f: Failure, options) -> list[dict]:
    from memfit.planner.knobs import changed
    from memfit.planner.search import Search, fits

    search = Search(base, set(), None, options)
    start = search.build(search.bk, search.ak)
    if start is None:
        return []
    candidates = [search.build(k, search.ak) for k in search.states if len(changed(search.bk, k)) == 1]
    candidates += [search.build(search.bk, a) for a in search.acts if len(changed(search.ak, a)) == 1]
    best: dict[str, dict] = {}
    for c in (c for c in candidates if c is not None):
        j = search.estimate(c)
        if not fits(j) or not frees_enough(f, start.scenario, c.scenario):
            continue
        fx = _single_fix(search, c, j)
        change = fx["changes"][0]
        # values of one knob are one fix (the fastest that fits); each layout is an approach of its own
        knob = change["knob"] + (f":{change['after']}" if change["knob"] in DISTINCT_VALUES else "")
        if knob not in best or fx["tokens_per_second"] > best[knob]["tokens_per_second"]:
            best[knob] = fx
    return sorted(best.values(), key=lambda fx: -fx["tokens_per_second"])


def frees_enough(f: Failure, before, after) -> bool:
    """`after` (a Scenario) lowers the memory that ran out in `before`, at the failing phase (else at the peak),
    by at least what the log shows was missing there (the request minus what was free)."""
    from memfit.roles.estimate import estimate

    a, b = estimate(before), estimate(after)
    if f.kind == "host_oom" or f.form == "nccl-shm":
        return b.host.peak.total < a.host.peak.total
    missing = max((f.tried_to_allocate_bytes or 0) - (f.free_bytes or 0), 0) if f.free_bytes is not None else 0
    phase = f.phase if f.phase in a.device_total.phases else a.peak_phase
    return a.device_total.phases[phase].total - b.device_total.phases[phase].total >= max(missing, 1)


def _single_fix(search, c, j) -> dict:
    from memfit.planner.changes import code_edit, json_value
    from memfit.planner.knobs import changed

    group = "state" if changed(search.bk, c.state) else "act"
    old, new = (search.bk, c.state) if group == "state" else (search.ak, c.act)
    name = changed(old, new)[0]
    change = {"knob": name, "before": json_value(getattr(old, name)), "after": json_value(getattr(new, name))}
    return {"fix": f"{name.replace('_', ' ')} {change['before']} -> {change['after']}", "from": "planner",
            "changes": [change], "env": None, "why": "one change that makes this run fit by memfit's estimate",
            "verdict": j.verdict, "device_peak_bytes": j.device_peak, "host_peak_bytes": j.host_peak,
            "tokens_per_second": round(c.speed.tokens_per_second, 1),
            "code_edits": [str(e) for e in (code_edit(search, name, c.scenario),) if e]}


def plan_fix(row) -> dict:
    changes = [{"knob": c["knob"], "before": c["before"], "after": c["after"]} for c in
               (ch.to_json() for ch in row.changes)]
    words = ", ".join(f"{c['knob'].replace('_', ' ')} {c['before']} -> {c['after']}" for c in changes)
    return {"fix": words, "from": "planner", "changes": changes, "env": None,
            "why": "the planner's fastest configuration that fits", "verdict": row.verdict,
            "device_peak_bytes": row.device_peak_bytes, "host_peak_bytes": row.host_peak_bytes,
            "tokens_per_second": round(row.tokens_per_second, 1),
            "code_edits": [str(c.code_edit) for c in row.changes if c.code_edit]}


def _change_set(fx: dict) -> frozenset:
    return frozenset((c["knob"], str(c["after"])) for c in fx["changes"])
