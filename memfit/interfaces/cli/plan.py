"""`memfit plan`: the fastest configurations that fit, and what each change saves and costs.

Presentation only: the search is memfit/planner/ (plan.py). Registered by memfit/interfaces/cli/main.py::build_parser through
`add_plan_command(sub)`.
"""
from __future__ import annotations

import argparse
import json

from memfit.errors import MemfitError
from memfit.interfaces.cli.args import add_length_arguments, add_scenario_arguments, positive_int, scenario_from_args
from memfit.interfaces.cli.progress import progress
from memfit.interfaces.render.common import show
from memfit.facts.profiles import beyond_positions
from rich.markup import escape

GiB = 2**30
VERDICT_STYLE = {"fits": "bold green", "tight": "bold yellow", "oom": "bold red", "host_oom": "bold red"}


def add_plan_command(subparsers) -> None:
    p = subparsers.add_parser("plan", help="the fastest configurations that fit, with each change's saving and cost")
    add_scenario_arguments(p)  # includes --method (default sft); several-model methods go through memfit.roles.estimate
    p.add_argument("--global-batch", type=positive_int,
                   help="micro-batch x grad accumulation x GPUs to keep (default: the starting configuration's)")
    p.add_argument("--allow", default="", help="changes to the training method you accept: lora, qlora, 8bit "
                                               "(comma-separated; default none)")
    p.add_argument("--top", type=positive_int, default=5, help="rows to show (default 5)")
    p.add_argument("--no-code-edits", action="store_true",
                   help="leave out knobs the framework has no flag for (OpenRLHF pin_memory, ratio: an edit of "
                        "get_train_ds_config)")
    p.add_argument("--no-resume", action="store_true",
                   help="the run never resumes from a checkpoint: judge host RAM without the resume phase")
    p.add_argument("--budget", type=positive_int, default=None,
                   help="estimates the search may spend (default 2000); past it, it shows what it found and says so")
    p.add_argument("--json", action="store_true", help="print a JSON document instead of tables")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report (the plan table and the "
                                                  "start's charts) to FILE")
    add_length_arguments(p)  # --brief: the answer, the table and the next step; --detail (default): all
    limits = p.add_mutually_exclusive_group()
    limits.add_argument("--max-seq", action="store_true",
                        help="instead of plans: the longest sequence that fits, everything else fixed (no --gpu: "
                             "one row per catalog GPU)")
    limits.add_argument("--max-batch", action="store_true",
                        help="instead of plans: the largest micro-batch that fits, everything else fixed (no --gpu: "
                             "one row per catalog GPU)")
    from memfit.interfaces.lengths.cli import add_lengths_arguments

    add_lengths_arguments(p)  # --lengths DATA: plans judged by the data's worst micro-batch, not by --seq
    p.set_defaults(run=run_plan)


def run_plan(a: argparse.Namespace) -> int:
    from memfit.planner.plan import Options, baseline, closest_miss, search_plans

    if a.max_seq or a.max_batch:
        if a.lengths:
            raise MemfitError("--max-seq / --max-batch search one knob at --seq; --lengths judges plans by the data "
                              "(leave one out)")
        if a.html:
            raise MemfitError("--html draws plans; --max-seq / --max-batch have no HTML report yet")
        return run_limits(a)
    base = scenario_from_args(a)
    allow = {x.strip() for x in a.allow.split(",") if x.strip()}
    from memfit.interfaces.lengths.cli import plan_data

    with progress(f"reading the token lengths of {a.lengths}", a):
        data = plan_data(a, base, a.global_batch)
    options = Options(code_edits=not a.no_code_edits, resume=not a.no_resume, data=data, budget=a.budget)
    with progress(f"searching configurations of {base.model.id} on {base.world_size} x {base.hardware.gpu.name}", a):
        searched = search_plans(base, allow, a.global_batch, top_k=a.top, options=options)
        rows = searched.rows
        start = baseline(base, a.global_batch, options)
        # a run with settings memfit could not read has no closest plan: every change of it stays "tight"
        miss = None if rows or base.unread else closest_miss(base, allow, a.global_batch, options)
    from memfit.interfaces.cli.next_steps import plan_next

    nxt, command = plan_next(a, rows[0]) if rows else (None, None)
    doc = plan_json(start, rows, miss, options, searched) | {"next_command": command}
    if a.html:  # the plan document, and the estimate document of its start for the bars (render/html.py)
        from memfit.interfaces.render.html import plan_page, write_page
        from memfit.roles.estimate import estimate

        write_page(a.html, plan_page(doc, estimate(start.scenario).to_json()))
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        print_plan(start, rows, miss, allow, options, brief=a.brief)
        if searched.cut_short:
            print(cut_short_words(searched))
        if nxt:
            from memfit.interfaces.cli.next_steps import shell_lines

            print(shell_lines(nxt))
    return 0


def cut_short_words(searched) -> str:
    """The search stopped at its budget: what may be missing, and how to let it go on."""
    return (f"the search stopped at its budget of {searched.budget:,} estimates ({searched.estimates:,} spent): faster "
            f"configurations may be missing; rerun with --budget {2 * searched.budget}")


def run_limits(a: argparse.Namespace) -> int:
    """--max-seq / --max-batch: the limit on the GPU given, or on every GPU of the catalog."""
    from memfit.facts.catalog import gpus
    from memfit.interfaces.render.limits import limits_json, print_limits
    from memfit.planner.limits import limit, limits_per_gpu

    flag = "--max-seq" if a.max_seq else "--max-batch"
    if a.global_batch or a.allow:
        raise MemfitError(f"{flag} keeps every other knob as given; leave out --global-batch and --allow")
    knob = "seq_len" if a.max_seq else "micro_batch"
    gpu_given = bool(a.gpu or a.gpu_mem)
    s = scenario_from_args(a if gpu_given else _on_stand_in_gpu(a))
    resume = not a.no_resume
    with progress(f"searching the largest {knob.replace('_', ' ')} that fits", a):
        rows = [limit(s, knob, resume=resume)] if gpu_given else limits_per_gpu(s, knob, gpus(), resume)
    if a.json:
        print(json.dumps(limits_json(s, knob, rows, gpu_given, resume), indent=2))
    else:
        print_limits(s, knob, rows, gpu_given)
    return 0


def _on_stand_in_gpu(a: argparse.Namespace) -> argparse.Namespace:
    """The arguments with a catalog GPU filled in: the scenario is built once (the knobs and the framework's
    defaults do not depend on the GPU kind) and then moved to each GPU, whose own rules judge the knobs again.
    The newest compute capability refuses the fewest knobs (flash attention and bf16 need Ampere)."""
    from memfit.facts.catalog import gpus

    newest = max(gpus(), key=lambda g: g.compute_capability)
    return argparse.Namespace(**{**vars(a), "gpu": newest.id})


def plan_json(start, rows, miss, options=None, searched=None) -> dict:
    s = start.scenario
    return {
        "schema": "memfit.plan/1",
        "model": s.model.id, "method": s.method, "gpu": s.hardware.gpu.name,
        "gpu_memory_bytes": s.hardware.gpu.memory_bytes,
        "gpus_per_node": s.hardware.gpus_per_node, "nodes": s.hardware.nodes,
        "host_ram_bytes": s.hardware.host_ram, "profile": s.profile,
        "code_edits_searched": options.code_edits if options else True,
        "resume_judged": options.resume if options else True,
        "start": start.to_json(),
        "rows": [r.to_json() for r in rows],
        "closest_miss": miss.to_json() if miss else None,
        "not_read": list(s.unread),  # memory settings no reader read: no row of such a run is "fits"
        "warnings": beyond_positions(s),
        "note": "tokens/s come from memfit's step-time model (data/speed.toml); they rank, they do not promise",
        "padded_fill": padded_fill(start, rows),
    } | ({"lengths": options.data.source} if options is not None and options.data else {}) | (
        {"search": searched.to_json()} if searched is not None else {})


# ---------------------------------------------------------------- words for knob values


def _sharding(v) -> str:
    """A planner Layout in words."""
    if v.engine == "deepspeed":
        return f"ZeRO-{v.zero_stage}"
    if v.engine == "fsdp":
        return f"FSDP {v.fsdp_strategy}"
    return {"ddp": "DDP", "single": "one GPU"}.get(v.engine, v.engine)


def describe(change, row) -> str:
    """One change in words, with the values the planned scenario carries (grad accum, sub-groups)."""
    s = row.scenario
    name, before, after = change.knob, change.before, change.after
    if name == "sharding":
        return f"{_sharding(before)} -> {_sharding(after)}"
    if name == "tuning" and s.uses_adapters:
        return f"tuning {before} -> {after} (rank {s.lora_rank}, {','.join(s.lora_targets)})"
    if name == "offload":
        what = "FSDP CPU offload" if s.engine == "fsdp" else "optimizer offload"
        return f"{what} {before} -> {after}"
    if name == "ratio" and s.engine == "deepspeed":
        return f"offload ratio {before:g} -> {after:g} (sub_group_size {s.sub_group_size:,})"
    if name == "pin_memory":
        return f"pin_memory {str(before).lower()} -> {str(after).lower()}"
    if name == "offload_param":
        return f"parameter offload {before} -> {after}"
    if name == "micro_batch":
        return f"micro-batch {before} -> {after} (grad accum {s.grad_accum})"
    if name == "checkpointing" and after == "every_n":
        return f"checkpointing {before} -> every {s.checkpoint_every_n} layers"
    if name in ROLE_WORDS:
        return f"{ROLE_WORDS[name]} {_onoff(before)} -> {_onoff(after)}"
    return f"{name.replace('_', ' ')} {before} -> {after}"


# several-model knobs in the words (and OpenRLHF flags) users know them by
ROLE_WORDS = {"ref_offload": "reference offload (--ref_offload / --ref.offload)",
              "reward_offload": "reward model offload (--reward.offload)",
              "vllm_gpu_memory_utilization": "vLLM gpu_memory_utilization",
              "vllm_sleep": "vLLM sleep (--vllm_enable_sleep)",
              "deepspeed_sleep": "DeepSpeed sleep (--deepspeed_enable_sleep)"}


def _onoff(v) -> str:
    return ("on" if v else "off") if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)


def _gib(n: int) -> str:
    return f"{n / GiB:,.1f}"


def _signed(saving: int, unit: str) -> str:
    """A saving in words that read the right way round: "saves -19.5 GiB/GPU" reads backwards."""
    return f"saves {_gib(saving)} {unit}" if saving >= 0 else f"costs {_gib(-saving)} {unit} more"


def _saving(change, host_known: bool) -> str:
    parts = [_signed(change.device_saving_bytes, "GiB/GPU")]
    if abs(change.in_plan_device_saving_bytes - change.device_saving_bytes) >= GiB and change.measured == "alone":
        parts[0] += f" alone ({_signed(change.in_plan_device_saving_bytes, 'in this plan')})"
    if change.host_saving_bytes and (host_known or change.host_saving_bytes < 0):
        parts.append(_signed(change.host_saving_bytes, "GiB host"))
    return ", ".join(parts)


# ---------------------------------------------------------------- tables


def print_plan(start, rows, miss, allow: set[str], options=None, brief: bool = False) -> None:
    from rich.console import Console

    con = Console()
    con.print(answer(start, rows, miss))  # the first line is the answer (wrapped at the terminal's width)
    _print_header(con, start, options)
    host_known = start.scenario.hardware.host_ram is not None
    if not rows:
        if start.scenario.unread:  # no plan of it is "fits" (planner/search.py judge), whatever it changes
            _print_unread(con, start.scenario.unread)
            return
        if miss:
            host_room = miss.host_headroom_bytes
            con.print(f"closest: {miss.verdict}, {_gib(miss.device_peak_bytes)} GiB/GPU "
                      f"(headroom {_gib(miss.headroom_bytes)}), host {_gib(miss.host_peak_bytes)} GiB"
                      + (f" (headroom {_gib(host_room)})" if host_room is not None else ""))
            for c in miss.changes:
                con.print(f"   {describe(c, miss)}: {_saving(c, host_known)}" + _edit_words(c))
        con.print("next: " + ("--allow lora,qlora,8bit widens the search" if not allow else
                              "more GPUs (--gpus), a larger card (--gpu) or a shorter --seq"))
        return
    _print_table(con, start, rows)
    for line in fill_words(start, rows):
        con.print(line)
    if brief:
        con.print("[dim]--brief: each plan's changes and what they save are left out (--detail shows them)[/]")
        return
    for i, r in enumerate(rows, 1):
        lines = []
        for c in r.changes:
            why = ("[bold]needed to fit[/]" if c.needed_to_fit else
                   "[dim]for speed[/]" if c.speed_cost_pct <= 0 else "[dim]for headroom[/]")
            how = "" if c.measured == "alone" else " [dim](saving measured in the plan)[/]"
            lines.append(f"{describe(c, r)}: {_saving(c, host_known)}, speed {-c.speed_cost_pct:+.1f}% "
                         f"{why}{how}" + _edit_words(c))
        _numbered(con, i, lines + _decided_words(r))
    con.print("[dim]saves / costs: the change applied alone to the start (or, where it cannot stand alone, removed from the "
              "plan); speed: the plan with vs without it. tokens/s come from memfit's step-time model "
              "(data/speed.toml): they rank, they do not promise[/]")


def answer(start, rows, miss) -> str:
    """The plan's verdict in one line: how many configurations fit and the fastest, or the closest miss."""
    s = start.scenario
    if not rows and s.unread:
        n = len(s.unread)
        return (f"[bold yellow]no configuration can be called fits: memfit could not read {n} memory "
                f"setting{'s' * (n > 1)} of the run, so every estimate of it is at most tight[/]")
    machine = f"{s.hardware.world_size} x {escape(s.hardware.gpu.name)}"
    if not rows:
        line = f"[bold red]nothing fits on {machine}[/]"
        if miss:
            over = max(-miss.headroom_bytes, -(miss.host_headroom_bytes or 0))
            line += (f"; closest: {miss.verdict}, {_gib(miss.device_peak_bytes)} GiB per GPU, {_gib(over)} GiB over"
                     f" ({_kind(miss)})")
        return line
    best, fitting = rows[0], sum(r.verdict == "fits" for r in rows)
    count = (f"{fitting} configurations fit" if fitting != 1 else "1 configuration fits") + (
        f", {len(rows) - fitting} tight" if fitting < len(rows) else "")
    return (f"[{VERDICT_STYLE[best.verdict]}]{count}[/] on {machine}; fastest: {best.tokens_per_second:,.0f} "
            f"tokens/s ({_kind(best)}), {_gib(best.device_peak_bytes)} GiB per GPU")


def _kind(row) -> str:
    """A row's changes as their new values, in a few words (the numbered list below has each in full)."""
    if not row.changes:
        return "the start as given"
    words = [_sharding(c.after) if c.knob == "sharding" else
             f"{KIND_WORDS.get(c.knob, c.knob.replace('_', ' '))} {_onoff(c.after)}" for c in row.changes]
    return ", ".join(words[:3]) + (f", +{len(words) - 3} more" if len(words) > 3 else "")


KIND_WORDS = {"offload": "optimizer offload", "offload_param": "parameter offload", "micro_batch": "micro-batch"}


def padded_fill(start, rows) -> dict | None:
    """The padded fill the step-time model assumes (data/speed.toml padded_fill) and the runs whose tokens/s count
    it ("start", 1, 2, ...), or None when no compared run is padded."""
    from memfit.planner.speed import _padding_fill  # the one place the model decides a run is counted as padded

    padded = [(name, f) for name, r in [("start", start)] + [(i, r) for i, r in enumerate(rows, 1)]
              if (f := _padding_fill(r.scenario)) < 1]
    if not padded:
        return None
    return {"fill": padded[0][1], "runs": [name for name, _ in padded], "source": "data/speed.toml padded_fill",
            "without_it": "--padding packed or --micro-batch 1"}


def fill_words(start, rows) -> list[str]:
    """The padded fill, named where a compared run's tokens/s counts it: it alone can make micro-batch 4 -> 1 look
    30% faster."""
    fill = padded_fill(start, rows)
    if fill is None:
        return []
    which = ", ".join(name if name == "start" else f"#{name}" for name in fill["runs"])
    fill = fill["fill"]
    return [f"[dim]padded fill: tokens/s assume {fill:.0%} of a padded micro-batch's positions are real tokens "
            f"(data/speed.toml padded_fill; {which}); one-row and packed batches count 100%: --padding packed "
            f"or --micro-batch 1 ranks without it[/]"]


def _print_unread(con, unread: tuple[str, ...]) -> None:
    """A run with memory settings memfit could not read: no configuration of it can be called "fits" (the
    estimate leaves those settings out), whatever the search changes, so no closest plan either. Each setting,
    and what to do next."""
    for what in unread:
        con.print(f"  not read: {what}")
    con.print("next: state each setting in a form memfit reads (a key of the framework's config file or a flag "
              "memfit knows) or remove it, then run memfit plan again (memfit estimate --from shows the estimate "
              "without it)")


def _numbered(con, number: int, lines: list[str]) -> None:
    """A plan's changes under its number, each wrapped under its own first word (a hanging indent), not under
    the number: the list reads at 80 columns."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, justify="right", min_width=3)
    grid.add_column(overflow="fold")
    for k, line in enumerate(lines):
        grid.add_row(f"[bold]{number}.[/]" if k == 0 else "", line)
    if lines:
        con.print(grid)


def _decided_words(row) -> list[str]:
    """--lengths: which micro-batch of the data the row was judged at."""
    b = row.decided_by
    if b is None:
        return []
    return [f"[dim]judged at the data's worst micro-batch: step {b.step}, rank {b.rank}, {b.rows} rows x {b.seq_len} "
            f"tokens ({'exact' if b.exact else 'assumed order'})[/]"]


def _edit_words(change) -> str:
    return f"\n[bold magenta]needs a code edit[/] (no flag): {change.code_edit}" if change.code_edit else ""


def _print_header(con, start, options) -> None:
    s = start.scenario
    hw = s.hardware
    host_known = hw.host_ram is not None
    con.print(f"[bold]{s.model.id}[/] on {hw.gpus_per_node} x {hw.gpu.name} ({hw.gpu.memory_bytes / GiB:.2f} GiB)"
              + (f" x {hw.nodes} nodes" if hw.nodes > 1 else "")
              + (f", host {hw.host_ram / GiB:,.0f} GiB/node" if host_known else "")
              + f"  [dim]profile {s.profile}, method {s.method}"
              + ("" if options is None or options.resume else ", host judged without a resume (--no-resume)")
              + ("" if options is None or options.code_edits else ", no code edits") + "[/]")
    global_batch = s.micro_batch * s.grad_accum * s.world_size
    con.print(f"start: [{VERDICT_STYLE[start.verdict]}]{start.verdict}[/], {_gib(start.device_peak_bytes)} GiB/GPU, "
              + (f"host {_gib(start.host_peak_bytes)} GiB, " if host_known else "")
              + f"global batch {global_batch} (micro {s.micro_batch} x accum {s.grad_accum} x {s.world_size} GPUs), "
              + (f"predicted {start.tokens_per_second:,.0f} tokens/s" + (" if it fit" if start.verdict == "oom" else "")
                 if start.tokens_per_second > 0 else "it cannot run: vLLM has no room for one sequence's KV cache"))
    for warning in beyond_positions(s):  # estimate lists it under assumed; here it is the line to notice
        con.print(f"[bold yellow]warning[/]: {escape(warning)}")
    if options is not None and options.data:
        con.print(f"[dim]--lengths {options.data.source}: every plan is judged at its worst micro-batch of the data "
                  "(cut at --seq), not at --seq; tokens/s still speak of --seq[/]")
        for line in _decided_words(start):
            con.print("start " + line)


def _print_table(con, start, rows) -> None:
    from rich.table import Table

    table = Table(title="configurations that fit, fastest first")
    from memfit.planner.throughput import band

    b = band()
    for col in ("#", "verdict", "GiB/GPU", "headroom", "host GiB", "tokens/s", "step s", "vs start", "tie", "changes"):
        table.add_column(col, justify="right" if col not in ("verdict", "changes", "tie") else "left")
    for i, r in enumerate(rows, 1):
        gain = (f"{(r.tokens_per_second / start.tokens_per_second - 1) * 100:+.0f}%"
                if start.tokens_per_second > 0 else "-")
        edits = sum(bool(c.code_edit) for c in r.changes)
        changes = (str(len(r.changes)) + (f" ({edits} code edit{'s' * (edits > 1)})" if edits else "")
                   if r.changes else "none (start fits)")
        tie = ("= " + ",".join(map(str, r.ties_with))) if r.ties_with else ""
        table.add_row(str(i), f"[{VERDICT_STYLE[r.verdict]}]{r.verdict}[/]", _gib(r.device_peak_bytes),
                      _gib(r.headroom_bytes), _gib(r.host_peak_bytes), f"{r.tokens_per_second:,.0f}",
                      f"{r.step_seconds:.3g}", gain, tie, changes)
    show(con, table)
    con.print(f"[dim]tokens/s: measured runs land in {b.low:.2f}-{b.high:.2f}x of it ({b.coverage:.0%} of them)[/]")
    if any(r.ties_with for r in rows):
        from memfit.planner.throughput import tie_band

        con.print(f"[bold]tie[/]: rows marked = differ by less than {tie_band():.0%} in predicted speed, which measured "
                  "runs cannot tell apart; among them fewer changes, then more memory margin, ranks first")
