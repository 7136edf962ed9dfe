"""Terminal presentation of an estimate (rich). Reads results; never computes memory."""
from __future__ import annotations

from memfit.breakdown import CATEGORIES, PHASES
from memfit.interfaces.render.common import VERDICT_STYLE, console, gib, show
from memfit.interfaces.render.roles import print_roles


def _setup_line(s) -> str:
    from memfit.facts.adapters import wraps
    from memfit.facts.engines import engine_of
    from memfit.facts.knobs import inert_because

    rank = f" r{s.lora_rank}" if inert_because(s, "lora_rank") is None else ""  # IA3, OFT, ...: no rank
    # prompts (PEFT's virtual tokens, LitGPT's LLaMA-Adapter) adapt no named modules
    targeted = s.uses_adapters and wraps(s.tuning) not in ("virtual_tokens", "prompt_attention")
    bits = " 8-bit" if s.tuning == "qlora" and s.quant_bits == 8 else ""
    tuning = f"{s.tuning}{bits}{rank}" + (f" ({','.join(s.lora_targets)})" if targeted else "")
    return (f"{tuning}, {s.precision}, {s.optimizer}, {engine_of(s).describe(s)}; micro-batch {s.micro_batch} x "
            f"{s.seq_len} tokens, grad-accum {s.grad_accum}; checkpointing {s.checkpointing}, attention {s.attention}, "
            f"loss {s.loss}")


def _band_text(e) -> str:
    """The error band the verdict was judged with, and inside it the chance of running out of memory."""
    width = gib(e.band_fraction * e.device_total.peak.total)
    band = f" (error band {e.band_fraction:.1%} = {width} GiB, {e.band_kind})"
    return band + (f", {e.oom_chance:.0%} chance of OOM" if e.verdict == "tight" else "")


def print_estimate(e) -> None:
    from rich.table import Table

    con = console()
    s = e.scenario
    hw = s.hardware
    nodes = f" per node, {hw.nodes} nodes" if hw.nodes > 1 else ""
    con.print(f"[bold]{s.model.id}[/] on {hw.gpus_per_node} x {hw.gpu.name} ({gib(hw.gpu.memory_bytes)} GiB usable)"
              f"{nodes}  [dim]profile {s.profile}[/]")
    con.print(f"params {e.total_params / 1e9:.2f}B, trainable {e.trainable_params / 1e9:.3f}B; {_setup_line(s)}")
    peak = e.device_total.peak_phase
    table = Table(title=f"per-GPU memory at the peak ({peak}), GiB")
    table.add_column("category")
    for name in ("allocated", "reserved", "device total"):
        table.add_column(name, justify="right")
    profiles = (e.allocated.phases[peak], e.reserved.phases[peak], e.device_total.phases[peak])
    for c in CATEGORIES:
        table.add_row(c.replace("_", " "), *(gib(b.get(c)) for b in profiles))
    table.add_row("[bold]total[/]", *(f"[bold]{gib(b.total)}[/]" for b in profiles))
    show(con, table)
    phases = Table(title="peak by phase, GiB")
    phases.add_column("phase")
    for name in ("allocated", "device total", "host (node)"):
        phases.add_column(name, justify="right")
    for p in PHASES:
        mark = " <- peak" if p == peak else ""
        phases.add_row(p + mark, gib(e.allocated.phases[p].total), gib(e.device_total.phases[p].total),
                       gib(e.host.phases[p].total))
    show(con, phases)
    host = e.host.peak
    parts = ", ".join(f"{c.replace('_', ' ')} {gib(host.get(c))}" for c in CATEGORIES if host.get(c))
    con.print(f"host RAM per node peaks at {gib(host.total)} GiB in {e.host.peak_phase}: {parts}")
    style = VERDICT_STYLE[e.verdict]
    paged = e.group().evictable
    held = f" ({gib(paged)} GiB of it paged optimizer states the driver may move to host RAM)" if paged else ""
    verdict = f"[{style}]{e.verdict.upper()}[/]: device total {gib(e.device_total.peak.total)} GiB{held} of " \
              f"{gib(hw.gpu.memory_bytes)} GiB, margin {gib(e.margin_bytes)} GiB" + _band_text(e)
    if e.host_margin_bytes is not None:
        verdict += f"; host margin {gib(e.host_margin_bytes)} GiB"
    con.print(verdict)
    if len(e.roles) > 1 or len(e.groups) > 1:  # several models: where each sits and what each holds
        print_roles(e)
    if e.assumptions:
        con.print("[dim]assumed: " + "; ".join(e.assumptions) + "[/]")


def _duration(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def print_speed(speed: dict, gpus: int) -> None:
    """The step-time model's lines under the verdict: step time, tokens/s with the band measured rows land in,
    and the whole run's wall-clock and cost when the data's size was given."""
    con = console()
    b = speed["band"]
    tps = speed["tokens_per_s"]
    con.print(f"speed: {tps:,.0f} tokens/s on {gpus} GPU{'s' * (gpus > 1)} ({tps * b['low']:,.0f}-{tps * b['high']:,.0f}"
              f" for {b['coverage']:.0%} of measured runs), {speed['step_s']:.3g} s a step  [dim]memfit's step-time "
              f"model (data/speed.toml)[/]")
    run = speed.get("run")
    if run is None:
        con.print("[dim]add --tokens N (or --lengths DATA --epochs E) and --price-per-gpu-hour P for the run's "
                  "wall-clock and cost[/]")
        return
    lo, hi = run["seconds_band"]
    line = (f"run: {run['tokens']:,} tokens in {_duration(run['seconds'])} ({_duration(lo)}-{_duration(hi)}), "
            f"{run['gpu_hours']:,.1f} GPU-hours")
    if "cost" in run:
        line += f", cost {run['cost']:,.2f} ({run['cost_band'][0]:,.2f}-{run['cost_band'][1]:,.2f})"
    con.print(line)


def print_comparison(estimated, other, other_name: str) -> None:
    """The analytic allocated profile next to a trace's or a measurement's, per category at each peak."""
    from rich.table import Table

    table = Table(title=f"allocated at the peak: memfit vs {other_name}, GiB "
                        f"(memfit peaks in {estimated.peak_phase}, {other_name} in {other.peak_phase})")
    for col in ("category", "memfit", other_name, "error"):
        table.add_column(col, justify="right")
    a, b = estimated.peak, other.peak
    for c in (*CATEGORIES, "total"):
        x, y = (a.total, b.total) if c == "total" else (a.get(c), b.get(c))
        err = f"{100 * (x - y) / y:+.1f}%" if y else ""
        table.add_row(c.replace("_", " "), gib(x), gib(y), err)
    show(console(), table)
