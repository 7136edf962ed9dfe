"""memfit plan: search time (target <= 2 s) and, for the user reports that ran out of memory, the plan
memfit chooses against the fix the report names.

    python bench/plan.py [--cases cases/user-reports.jsonl] [--summary-json]

A report's fix counts as found when one of the plan's top 3 rows makes that change (e.g. optimizer
offload to cpu, LoRA, micro-batch 2, ZeRO-3, flash attention), or when a top-3 row fits and memfit's
speed model rates it at least as fast as the reported fix.

What the bench assumes (printed with the table):
- Cases map to scenarios by bench/published.py::scenario_for: the stated GPUs on ONE node unless the
  case says otherwise (the Qwen2.5-72B reports do not state their layout: 1 node x 8 A100-80GB, the
  case's own assumption); an unstated sequence length is 2048 (as tests/test_user_reports.py); a global
  batch stated in source_detail ("global batch 128") is kept.
- Host RAM "1400 GB" is 1.4e12 bytes (1,304 GiB). A report about a fresh start is judged without the
  resume phase (plan Options(resume=False)); a report whose notes say it resumed, with it.
- The plan may propose knobs the framework has no flag for as code edits (OpenRLHF pin_memory / ratio:
  an edit of get_train_ds_config), marked as such; the reported fixes for the 72B reports are such edits.
- When a reported fix does not fit in memfit's model, the bench says by how much at the assumed layout,
  and whether another layout (2 nodes of 8) would reproduce the report: the start's OOM and the fix's fit.
- `memfit fit` runs on an example file of the report's kind (tests/formats/examples, same flags as the
  case) and the framework's own parser reads what it wrote: OpenRLHF's argparse rebuilt from the released
  wheel, LLaMA-Factory's get_train_args in its venv (memfit/interfaces/formats/validate.py, validate_openrlhf.py); a code edit is written
  as its own file beside the command.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from published import Skip, scenario_for  # noqa: E402
from shared_cases import USER_REPORTS  # noqa: E402

from memfit.facts.catalog import find_gpu, find_model  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402
from memfit.planner.plan import Options, PlanRow, closest_miss, plan  # noqa: E402
from memfit.planner.search import judge  # noqa: E402
from memfit.planner.step_time import step_time  # noqa: E402
from memfit.roles.estimate import estimate  # noqa: E402
from memfit.facts.profiles import build_scenario  # noqa: E402
from memfit.facts.scenario import Hardware  # noqa: E402
from memfit.facts.versions import installed  # noqa: E402
from memfit.interfaces.render.common import show  # noqa: E402

DEFAULT_CASES = USER_REPORTS
TOP = 3
UNSTATED_SEQ = 2048
RATIO_SUB_GROUP = 100_000_000  # the sub_group_size tests/test_user_reports.py gives ratio 0.9 to act on


def _ds(**kw):
    return lambda s: s.with_changes(**kw)


# What each OOM report's maintainers said to change: (words, "does this plan row make it?", the fix
# applied to the reported scenario).
FIXES = {
    "report-qwen2-7b-4x4090-z3": [
        ("Adam offload (offload_optimizer cpu)",
         lambda s: s.engine == "deepspeed" and s.offload_optimizer == "cpu",
         _ds(offload_optimizer="cpu")),
        ("LoRA", lambda s: s.tuning == "lora",
         lambda s: s.with_changes(tuning="lora", lora_rank=16)),
    ],
    "report-llama31-8b-lora-7x4090-ddp": [
        ("ZeRO-3", lambda s: s.zero_stage == 3,
         lambda s: build_scenario(s.model, s.hardware, {"tuning": "lora", "lora_rank": s.lora_rank,
                                                        "micro_batch": s.micro_batch, "grad_accum": s.grad_accum,
                                                        "seq_len": s.seq_len, "precision": s.precision,
                                                        "zero_stage": 3}, s.profile)),
        ("micro-batch 2", lambda s: s.micro_batch == 2,  # same global batch: the accumulation grows
         lambda s: s.with_changes(micro_batch=2, grad_accum=s.micro_batch * s.grad_accum // 2)),
    ],
    "report-qwen25-72b-offload-pinned": [
        ("pin_memory false", lambda s: s.engine == "deepspeed" and not s.pin_memory,
         _ds(pin_memory=False)),
        ("ratio 0.9", lambda s: s.engine == "deepspeed" and s.ratio == 0.9,
         _ds(ratio=0.9, sub_group_size=RATIO_SUB_GROUP)),
    ],
    "report-qwen25-72b-offload-unpinned-resume": [
        ("ratio 0.9", lambda s: s.engine == "deepspeed" and s.ratio == 0.9,
         _ds(ratio=0.9, sub_group_size=RATIO_SUB_GROUP)),
    ],
    "report-glm4-9b-dpo-eager": [
        ("flash attention", lambda s: s.attention == "flash", lambda s: s.with_changes(attention="flash")),
    ],
}
OTHER_LAYOUTS = ((8, 2),)  # (GPUs per node, nodes) probed when a reported fix does not fit at the assumed one

# `memfit fit` on a file like the report's (tests/formats/examples), then the framework's own parser on it
EXAMPLES = HERE.parent / "tests" / "formats" / "examples"
FIT_FILES = {
    "report-qwen2-7b-4x4090-z3": ("openrlhf/qwen2_7b_4x4090_z3.sh", ["--gpu", "rtx4090", "--gpus", "4"]),
    "report-glm4-9b-dpo-eager": ("openrlhf/glm4_9b_dpo_eager.sh", ["--gpu", "a100-80gb", "--gpus", "8"]),
    "report-qwen25-72b-offload-pinned": ("openrlhf/qwen25_72b_offload.sh",
                                         ["--gpu", "a100-80gb", "--gpus", "8", "--host-ram", "1400GB", "--no-resume"]),
    "report-qwen25-72b-offload-unpinned-resume": ("openrlhf/qwen25_72b_offload.sh",
                                                  ["--gpu", "a100-80gb", "--gpus", "8", "--host-ram", "1400GB"]),
    "report-llama31-8b-lora-7x4090-ddp": ("llamafactory/examples/train_lora/llama31_8b_lora_7x4090.yaml",
                                          ["--gpu", "rtx4090", "--gpus", "7"]),
}

# Heavy searches for the timing line: wide knob spaces, every tuning change allowed.
STRESS = [
    ("Llama-3.1-8B full, 8x4090, trl, allow all", "meta-llama/Llama-3.1-8B-Instruct", "rtx4090", 8, "trl",
     {"tuning": "full", "micro_batch": 16, "seq_len": 4096}, 10**12),
    ("Qwen2.5-72B full, 8xH100, trl, allow all", "Qwen/Qwen2.5-72B-Instruct", "h100", 8, "trl",
     {"tuning": "full", "micro_batch": 16, "seq_len": 4096}, 2 * 10**12),
    ("Qwen2-7B full, 1x4090, llamafactory, allow all", "Qwen/Qwen2-7B-Instruct", "rtx4090", 1, "llamafactory",
     {"tuning": "full", "micro_batch": 8, "seq_len": 2048}, 128 * 10**9),
    ("PPO 7B actor/critic/ref/reward + vLLM colocated, 8xA100, openrlhf", "llama-2-7b", "a100-80gb", 8, "openrlhf",
     {"method": "ppo", "zero_stage": 3, "micro_batch": 4, "seq_len": 2048, "checkpointing": "full",
      "colocate": "all", "vllm_tp": 2, "rollout_micro_batch": 8}, 2 * 10**12),
]


def report_scenario(case: dict):
    case = dict(case)
    if not case.get("seq_len"):
        case["seq_len"] = UNSTATED_SEQ
    s = scenario_for(case)
    if case.get("host_ram_value"):
        unit = 1e9 if (case.get("host_ram_unit") or "GB").upper() == "GB" else 2**30
        s = s.with_changes(hardware=replace(s.hardware, host_ram=int(case["host_ram_value"] * unit)))
    offload = (case.get("offload") or "").replace(" ", "").lower()
    if s.engine == "deepspeed" and "pin_memory=" in offload:
        s = _ds(pin_memory="pin_memory=true" in offload)(s)
    if s.engine == "deepspeed" and "ratio=" in offload:
        s = _ds(ratio=float(offload.split("ratio=")[1].split(",")[0]), sub_group_size=RATIO_SUB_GROUP)(s)
    return s


def resumed(case: dict) -> bool:
    """The report is about resuming from a checkpoint (its notes say "phase: resuming"); else a fresh start."""
    return re.search(r"phase:\s*resum", (case.get("notes") or "").lower()) is not None


def global_batch_of(case: dict) -> int | None:
    m = re.search(r"global batch (\d+)", case.get("source_detail") or "")
    return int(m.group(1)) if m else None


def timed_plan(s, allow=frozenset(), top_k=5, global_batch=None, options=None) -> tuple[list[PlanRow], float]:
    t = time.perf_counter()
    rows = plan(s, set(allow), global_batch, top_k, options or Options())
    return rows, time.perf_counter() - t


def _gib(n: int) -> str:
    return f"{n / 2**30:,.0f}"


def _changes(row: PlanRow) -> str:
    return ", ".join(f"{c.knob} {c.before}->{c.after}" for c in row.changes) or "(no change)"


def check(case: dict) -> dict:
    out = {"id": case["id"], "plan_fits": False, "reported_fix_in_top3": False, "covered": True}
    try:
        base = report_scenario(case)
    except (Skip, MemfitError) as e:
        return out | {"covered": False, "reason": str(e)}
    options = Options(resume=resumed(case))
    batch = global_batch_of(case)
    rows, seconds = timed_plan(base, global_batch=batch, options=options)
    out |= {"seconds": seconds, "start": judge(estimate(base), options.resume).verdict, "plan_fits": bool(rows),
            "phases": "at a resume" if options.resume else "fresh start",
            "top": [{"verdict": r.verdict, "tokens_per_second": r.tokens_per_second, "changes": _changes(r)}
                    for r in rows[:TOP]]}
    out["fixes"] = [_fix(base, fix, rows, options) for fix in FIXES.get(case["id"], [])]
    made = any(f["in_rows"] for f in out["fixes"])
    fastest_fix = max((f["tokens_per_second"] for f in out["fixes"]), default=None)
    faster = fastest_fix is not None and any(r.tokens_per_second >= fastest_fix for r in rows[:TOP])
    out["reported_fix_in_top3"] = made or faster
    out["how"] = "fix in top 3" if made else ("a faster fitting row" if faster else "no")
    if not rows:
        miss = closest_miss(base, global_batch=batch, options=options)
        if miss:
            out["closest"] = (f"{miss.verdict}: {miss.device_peak_bytes / 2**30:.1f} GiB/GPU, host "
                              f"{_gib(miss.host_peak_bytes)} GiB; {_changes(miss)}")
    if not out["reported_fix_in_top3"]:
        out["why"] = _why_not(base, out["fixes"], options)
    out["fit_file"] = fit_check(case["id"])
    return out


def _fix(base, fix, rows, options) -> dict:
    words, made_by, apply = fix
    fixed = apply(base)
    e = estimate(fixed)
    j = judge(e, options.resume)
    phase = max((p for p in e.host.phases if options.resume or p != "resume"), key=lambda p: e.host.phases[p].total)
    return {"fix": words, "memfit_verdict": j.verdict, "tokens_per_second": step_time(fixed).tokens_per_second,
            "in_rows": [i + 1 for i, r in enumerate(rows[:TOP]) if made_by(r.scenario)],
            "device_peak_gib": j.device_peak / 2**30, "host_peak_gib": j.host_peak / 2**30, "host_peak_phase": phase,
            "host_short_gib": -j.host_margin / 2**30 if j.host_margin is not None and j.host_margin < 0 else 0.0,
            "apply": apply}


def _unsaved_gpu_adam(s) -> int:
    """Host bytes per node memfit's resume counts for the Adam moments of the sub-groups `ratio` keeps on the
    GPU: DeepSpeed steps those with its backup torch AdamW, whose state the checkpoint does not hold."""
    if s.engine != "deepspeed" or s.ratio >= 1.0 or s.offload_optimizer == "none":
        return 0
    part = -(-estimate(s).trainable_params // s.world_size)
    groups = -(-part // s.sub_group_size)
    on_gpu = int((1 - s.ratio) * groups)  # stage3.py: sub-group i stays on the GPU iff i < int((1 - ratio) * S)
    return 8 * part * on_gpu // groups * s.hardware.gpus_per_node


def _why_not(base, fixes: list[dict], options) -> str:
    """In words: how far each reported fix is from fitting here, and whether another layout reproduces both
    the report's OOM and its fix (the layout is an assumption; it is not tuned to make the row pass)."""
    hw = base.hardware
    parts = [f"{f['fix']}: {f['memfit_verdict']}, host {f['host_peak_gib']:,.0f} GiB at {f['host_peak_phase']} "
             f"({f['host_short_gib']:,.0f} GiB over {_gib(hw.host_ram)})" if f["host_short_gib"]
             else f"{f['fix']}: {f['memfit_verdict']}, {f['device_peak_gib']:.1f} GiB/GPU" for f in fixes]
    for f in fixes:
        unsaved = _unsaved_gpu_adam(f["apply"](base))
        if unsaved and f["host_short_gib"]:
            left = f["host_short_gib"] - unsaved / 2**30
            verdict = f"still {left:,.0f} GiB over" if left > 0 else "it fits"
            parts.append(f"{f['fix']}: DeepSpeed 0.19.8 does not checkpoint the GPU sub-groups' Adam state "
                         "(stage3.py _rigid_state_dict saves only the CPU optimizer's), so memfit's resume "
                         f"(states.py) overcounts {_gib(unsaved)} GiB; without it {verdict}")
    for per_node, nodes in OTHER_LAYOUTS:
        other = base.with_changes(hardware=replace(hw, gpus_per_node=per_node, nodes=nodes))
        start = judge(estimate(other), options.resume)
        fixed = [judge(estimate(f["apply"](other)), options.resume).verdict for f in fixes]
        layout = f"{nodes} nodes x {per_node} GPUs"
        if start.verdict in ("fits", "tight"):
            parts.append(f"at {layout} the reported start already fits (host {_gib(start.host_peak)} GiB): "
                         "no OOM to fix there")
        else:
            parts.append(f"at {layout}: start {start.verdict}, fix {', '.join(fixed)}")
    return "; ".join(parts)


def fit_check(case_id: str) -> str:
    """`memfit fit` on the report's kind of file, and the framework's parser on what it wrote: "accepted",
    "refused: ...", "no fit: ..." (memfit wrote nothing) or "not checked: ..." (no parser here)."""
    import contextlib
    import io
    import tempfile

    from memfit.interfaces.cli.main import main as memfit_main
    from memfit.interfaces.formats import read_config

    if case_id not in FIT_FILES:
        return "not checked: no example file"
    name, args = FIT_FILES[case_id]
    with tempfile.TemporaryDirectory() as out:
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = memfit_main(["fit", str(EXAMPLES / name), *args, "--out", out])
        if code != 0:
            return "no fit: " + err.getvalue().strip().removeprefix("memfit: error: ")
        written = Path(out) / Path(name).name
        if not written.exists():
            return "accepted (the file already fits; nothing written)"
        edit = " + code edit file" if (Path(out) / f"{written.name}.code-edit.txt").exists() else ""
        return _parsed(read_config(written, gpus=int(args[args.index("--gpus") + 1])), written) + edit


def _parsed(imported, written: Path) -> str:
    from memfit.interfaces.formats import openrlhf, validate, validate_openrlhf

    try:
        if imported.format == "openrlhf":
            validate_openrlhf.validate_openrlhf(openrlhf.arguments(imported), imported.variant, imported.doc.script)
            return f"accepted (OpenRLHF {imported.variant} argparse)"
        if not (validate.LLAMAFACTORY_VENV / "bin" / "python").exists():
            return "not checked: no LLaMA-Factory venv (tests/formats/README.md)"
        validate.validate_llamafactory(imported.text, written.parent)
        return "accepted (LLaMA-Factory get_train_args)"
    except validate.ValidationFailed as e:
        return f"refused: {e}"
    except Exception as e:  # no wheel and no network: the parser is not here
        return f"not checked: {type(e).__name__}"


def stress_times() -> list[tuple[str, float, int]]:
    out = []
    for name, model, gpu, gpus, profile, knobs, host in STRESS:
        hw = Hardware(gpu=find_gpu(gpu), gpus_per_node=gpus, host_ram=host)
        s = build_scenario(find_model(model), hw, knobs, profile)
        rows, seconds = timed_plan(s, {"lora", "qlora", "8bit"})
        out.append((name, seconds, len(rows)))
    return out


def print_results(results: list[dict], stress: list[tuple[str, float, int]]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title="memfit plan search time (target <= 2 s)")
    for col in ("search", "seconds", "rows"):
        t.add_column(col)
    for r in results:
        if r.get("covered"):
            t.add_row(r["id"], f"{r['seconds']:.3f}", str(len(r["top"])))
    for name, seconds, n in stress:
        t.add_row(name, f"{seconds:.3f}", str(n))
    show(con, t)
    t = Table(title="OOM user reports: memfit's plan vs the reported fix", show_lines=True)
    for col in ("report", "start", "plan top 3 (tokens/s: changes)", "reported fix: memfit verdict, tokens/s, row",
                "fix in top 3", "memfit fit -> parser"):
        t.add_column(col)
    for r in results:
        if not r.get("covered"):
            t.add_row(r["id"], "-", f"not covered: {r['reason']}", "-", "-")
            continue
        top = "\n".join(f"{i}. {x['verdict']} {x['tokens_per_second']:,.0f}: {x['changes']}"
                        for i, x in enumerate(r["top"], 1)) or f"nothing fits; closest: {r.get('closest')}"
        fixes = "\n".join(f"{f['fix']}: {f['memfit_verdict']} (host {f['host_peak_gib']:,.0f} GiB at "
                          f"{f['host_peak_phase']}), {f['tokens_per_second']:,.0f}, rows {f['in_rows'] or '-'}"
                          for f in r["fixes"])
        fit = r["fit_file"] if len(r["fit_file"]) < 90 else r["fit_file"][:88] + "…"  # whole in --summary-json
        t.add_row(r["id"], f"{r['start']}\n({r['phases']})", top, fixes, f"{r['reported_fix_in_top3']} ({r['how']})",
                  fit)
    show(con, t)
    for r in results:
        if r.get("why"):
            con.print(f"[bold]{r['id']}[/]: reported fix not found: {r['why']}")
    assumed = __doc__.split("What the bench assumes (printed with the table):")[1].strip().replace("\n  ", " ")
    con.print("[bold]assumed[/]\n[dim]" + assumed + "[/]")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=str(DEFAULT_CASES))
    p.add_argument("--summary-json", action="store_true")
    a = p.parse_args()
    cases = [json.loads(line) for line in Path(a.cases).read_text().splitlines() if line.strip()]
    ooms = [c for c in cases if c.get("outcome") in ("oom", "host_oom")]
    try:
        results = [check(c) for c in ooms]
        stress = stress_times()
    except MemfitError as e:
        print(f"bench/plan.py: {e}", file=sys.stderr)
        return 2
    seconds = [r["seconds"] for r in results if "seconds" in r] + [s for _, s, _ in stress]
    if a.summary_json:
        print(json.dumps({
            "versions": installed(),
            "search_seconds_max": round(max(seconds), 3),
            "reports": [{"id": r["id"], "plan_fits": r["plan_fits"], "reported_fix_in_top3": r["reported_fix_in_top3"]}
                        | ({} if r["covered"] else {"covered": False, "reason": r["reason"]})
                        | ({"why": r["why"]} if r.get("why") else {})
                        | ({"fit_file": r["fit_file"]} if "fit_file" in r else {}) for r in results],
        }, indent=2))
    else:
        print_results(results, stress)
    return 0


if __name__ == "__main__":
    sys.exit(main())
