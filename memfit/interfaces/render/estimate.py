"""Terminal presentation of an estimate (rich). Reads results; never computes memory."""
from __future__ import annotations

from memfit.breakdown import CATEGORIES, PHASES
from memfit.interfaces.render.common import VERDICT_STYLE, console, gib, show
from memfit.interfaces.render.roles import print_roles, print_summary


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


VERDICT_WORD = {"fits": "FITS", "tight": "TIGHT", "oom": "OOM", "host_oom": "HOST OOM"}


def answer_line(e) -> str:
    """The estimate's first line: the verdict, the device total against the card, the margin against the error
    band it was judged with, and where the peak is."""
    from memfit.memory.phases import required_margin

    hw = e.scenario.hardware
    cap, margin = hw.gpu.memory_bytes, e.margin_bytes
    need = required_margin(cap - margin, cap, e.band_fraction)  # the margin "fits" asks (memory/phases.py)
    head = f"[{VERDICT_STYLE[e.verdict]}]{VERDICT_WORD[e.verdict]}[/]: "
    card = f"{gib(e.device_total.peak.total)} GiB per GPU of {gib(cap)} GiB"
    where = f"peak at {e.device_total.peak_phase}" + (f" in GPU group '{e.worst_group}'" if len(e.groups) > 1 else "")
    if e.verdict == "host_oom":
        host = e.host
        return (head + f"host RAM peaks at {gib(host.peak.total)} GiB per node of {gib(hw.host_ram)} GiB in "
                f"{host.peak_phase}, {gib(-e.host_margin_bytes)} GiB over; the GPU holds {card}")
    if margin < 0:
        room = f"{gib(-margin)} GiB over (cut {gib(need - margin)} GiB to clear its {gib(need)} GiB error band)"
    elif margin < need:
        room = f"{gib(margin)} GiB to spare, inside its {gib(need)} GiB error band ({e.oom_chance:.0%} chance of OOM)"
    elif e.scenario.unread:  # the margin clears the band, but the run has settings memfit did not read
        room = f"{gib(margin)} GiB to spare, but {len(e.scenario.unread)} memory setting(s) were not read (below)"
    else:
        room = f"{gib(margin)} GiB to spare (its error band asks {gib(need)} GiB)"
    return head + f"{card}, {room}, {where}"


def several_models(e) -> bool:
    return len(e.roles) > 1 or len(e.groups) > 1


def print_estimate(e, brief: bool = False) -> None:
    """The answer line, a per-role summary when several models run, then (unless `brief`) the detail."""
    from rich.table import Table

    con = console()
    s = e.scenario
    hw = s.hardware
    con.print(answer_line(e))  # the answer first; the breakdown below explains it
    if several_models(e):  # 100+ lines of detail follow: the short answer per role first
        print_summary(e)
    nodes = f" per node, {hw.nodes} nodes" if hw.nodes > 1 else ""
    con.print(f"[bold]{s.model.id}[/] on {hw.gpus_per_node} x {hw.gpu.name} ({gib(hw.gpu.memory_bytes)} GiB usable)"
              f"{nodes}  [dim]profile {s.profile}[/]")
    if brief:
        con.print("[dim]--brief: the breakdown, the phases and the assumptions are left out (--detail shows them)[/]")
        return
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
    verdict = f"[{style}]{e.verdict}[/] in detail: device total {gib(e.device_total.peak.total)} GiB{held} " \
              f"of {gib(hw.gpu.memory_bytes)} GiB, margin {gib(e.margin_bytes)} GiB" + _band_text(e)
    if e.host_margin_bytes is not None:
        verdict += f"; host margin {gib(e.host_margin_bytes)} GiB"
    con.print(verdict)
    if several_models(e):  # several models: where each sits and what each holds
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


def print_next_steps(e, nxt) -> None:
    """The last lines: what to do next (memfit/interfaces/cli/next_steps.py found them). Commands are printed
    unbroken (soft wrap) and unparsed by rich, so they copy as one line."""
    from rich.markup import escape

    con = console()
    plan, fit = escape(nxt.plan_command), escape(nxt.fit_command)
    if nxt.verdict == "fits":
        also = f"; {fit} writes the fastest into a copy of the file" if fit else ""
        con.print(f"[bold]next[/]: launch it as it is; for faster configurations that fit too: {plan}{also}",
                  soft_wrap=True)
        return
    if e.scenario.unread:  # every change of it stays "tight": the unread settings come first
        con.print(f"[bold]next[/]: state the {len(e.scenario.unread)} setting(s) memfit could not read (the \"not "
                  "read\" lines) in a form it reads, or remove them, and estimate again")
        return
    if not nxt.steps:
        allow = _allow_words(e.scenario)
        con.print("[bold]next[/]: no change of one or two of memfit's knobs fits with this method and tuning; "
                  f"search further: {plan}" + (f" --allow {allow}" if allow else ""), soft_wrap=True)
        return
    con.print("[bold]next[/]: add one of these to the same command (each fits; cheapest first):")
    for st in nxt.steps:
        con.print(f"  {escape(' '.join(st.flags))}   [dim]{gib(st.device_total_bytes)} GiB per GPU, "
                  f"{_speed_words(st.speed_cost)}[/]", soft_wrap=True)
    con.print(f"more (combinations, the fastest that fit): {plan}"
              + (f"; or let {fit} write the plan into the file" if fit else ""), soft_wrap=True)


def _speed_words(cost: float) -> str:
    if abs(cost) < 0.0005:
        return "same speed"
    return f"{cost:.1%} slower" if cost > 0 else f"{-cost:.1%} faster"


def _allow_words(s) -> str:
    """The method changes `memfit plan --allow` could try that this run does not have yet."""
    if s.tuning == "full":
        return "lora,qlora,8bit"
    return "qlora" if s.tuning == "lora" else ""
