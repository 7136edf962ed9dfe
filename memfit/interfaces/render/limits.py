"""`memfit plan --max-seq / --max-batch`: the limit per GPU as a table or as the "memfit.limits/1" document.

Presentation only: the search is memfit/planner/limits.py.
"""
from __future__ import annotations

from memfit.facts.methods import method_facts
from memfit.interfaces.render.common import VERDICT_STYLE, console, gib, show
from memfit.planner.knobs import config_of

SCHEMA = "memfit.limits/1"
LABEL = {"seq_len": "sequence length", "micro_batch": "micro-batch"}
RULE = ("the largest value whose estimate says 'fits': 'tight' (inside the estimate's error band), 'oom' and "
        "'host_oom' do not fit")


def fixed_knobs(s, knob: str) -> dict:
    """The knobs held fixed while `knob` is searched (the searched one, and what depends on it, left out)."""
    out = {"seq_len": s.seq_len} | config_of(s)
    out.pop(knob)
    if knob == "micro_batch":
        out.pop("global_batch")
    return out


def limits_json(s, knob: str, rows, gpu_given: bool, resume: bool = True) -> dict:
    hw = s.hardware
    return {
        "schema": SCHEMA, "model": s.model.id, "method": s.method, "profile": s.profile, "knob": knob,
        "gpu_given": gpu_given, "gpus_per_node": hw.gpus_per_node, "nodes": hw.nodes, "host_ram_bytes": hw.host_ram,
        "position_limit": s.model.max_position_embeddings or None, "resume_judged": resume,
        "rule": RULE, "fixed": fixed_knobs(s, knob), "rows": [r.to_json() for r in rows],
        "assumptions": list(s.assumed),
    }


STOP_WORDS = {"gpu_memory": "GPU memory", "host_ram": "host RAM", "vllm_kv_cache": "vLLM KV cache",
              "position_limit": "position limit", "search_cap": "search cap", "refused": "refused"}


def print_limits(s, knob: str, rows, gpu_given: bool) -> None:
    con = console()
    hw = s.hardware
    con.print(f"[bold]{s.model.id}[/]: the largest {LABEL[knob]} that fits on {hw.gpus_per_node} x "
              + (hw.gpu.name if gpu_given else "each catalog GPU")
              + (f" x {hw.nodes} nodes" if hw.nodes > 1 else "")
              + (f", host {hw.host_ram / 2**30:,.0f} GiB/node" if hw.host_ram else "")
              + f"  [dim]profile {s.profile}, method {s.method}[/]")
    fixed = fixed_knobs(s, knob)
    if fixed.get("checkpointing") != "every_n":
        fixed.pop("checkpoint_every_n", None)
    con.print("[dim]fixed: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in fixed.items() if v is not None)
              + "[/]")
    searched = [r for r in rows if r.at.verdict != "refused"]
    if searched:
        show(con, _table(knob, searched, hw.host_ram is not None))
    for message, ids in _refusals(rows).items():
        con.print(f"[bold]refused[/] on {', '.join(ids)}: {message}")
    for line in _notes(s, knob, searched):
        con.print(f"[dim]{line}[/]")


def _table(knob: str, rows, host_known: bool):
    from rich.table import Table

    table = Table()
    columns = ["GPU", "GiB", "max seq" if knob == "seq_len" else "max batch", "GiB/GPU", "headroom"]
    columns += ["host GiB"] * host_known + ["limited by"]
    for col in columns:
        table.add_column(col, justify="left" if col in ("GPU", "limited by") else "right")
    for r in rows:
        a = r.at
        value = f"{r.value:,}" if r.value is not None else "[bold red]none[/]" + (
            f" ([{VERDICT_STYLE[a.verdict]}]{a.verdict}[/])" if a.verdict != "fits" else "")
        cells = [r.gpu.id, f"{r.gpu.memory_bytes / 2**30:.1f}", value, gib(a.device_peak_bytes), gib(a.margin_bytes)]
        table.add_row(*cells, *[gib(a.host_peak_bytes)] * host_known, STOP_WORDS[r.cause])
    return table


def _refusals(rows) -> dict[str, list[str]]:
    """GPUs whose own rules refuse the knobs, grouped by the reason (the GPU's name left out of it)."""
    out: dict[str, list[str]] = {}
    for r in rows:
        if r.at.verdict == "refused":
            out.setdefault(r.at.message.replace(r.gpu.name, "the GPU"), []).append(r.gpu.id)
    return out


def _notes(s, knob: str, rows) -> list[str]:
    notes = [RULE + "; GiB/GPU and headroom are the device total (nvidia-smi) at that value, or at 1 when none "
                    "fits"]
    nxt = next((r.next for r in rows if r.stop in ("gpu_memory", "host_ram") and r.next), None)
    if nxt:
        notes.append(f"limited by memory: one more is not 'fits' (e.g. {nxt.value:,} is '{nxt.verdict}')")
    caps = {r.stop: r.cap for r in rows if r.stop in ("position_limit", "search_cap")}
    if "position_limit" in caps:
        notes.append(f"position limit: the model's max_position_embeddings ({caps['position_limit']:,}), not memory")
    if "search_cap" in caps:
        notes.append(f"search cap: memfit stops at {caps['search_cap']:,}, not memory")
    if any(r.stop == "none_fits" and r.at.verdict == "tight" for r in rows):
        notes.append("none (tight): even at 1 the run sits inside the estimate's error band"
                     + (f" (vLLM gpu_memory_utilization {s.vllm_gpu_memory_utilization:g} of each card it shares)"
                        if method_facts(s.method).get("generator") else ""))
    if any(r.cause == "vllm_kv_cache" for r in rows):
        notes.append("vLLM KV cache: vLLM's gpu_memory_utilization leaves no room for one sequence of that length")
    if knob == "seq_len" and not s.model.max_position_embeddings:
        notes.append("memfit does not know this model's position limit (max_position_embeddings): check the "
                     "context length it was trained for")
    return notes
