"""Terminal tables of a run with several roles: where each sits, what each GPU group holds at each moment.
Reads results; computes nothing."""
from __future__ import annotations

from memfit.breakdown import CATEGORIES
from memfit.interfaces.render.common import VERDICT_STYLE, console, gib, show
from memfit.memory.phases import verdict_of

SHORT = {"weights": "weights", "gradients": "grads", "optimizer_states": "optim", "activations": "activ",
         "logits_loss": "logits", "engine_buffers": "buffers", "runtime_overhead": "runtime"}


def role_peaks(e) -> list[tuple[str, int, int, str, str]]:
    """Each role's (role, GPUs, device total per GPU at its own peak, the moment of that peak, its GPU group), read
    from its group's moments: what the summary under the answer line shows."""
    out = []
    for r in e.roles:
        g = e.group(r.group)
        held = {m: by_role[r.role].total for m, by_role in g.moments.items() if r.role in by_role}
        moment = max(held, key=held.__getitem__) if held else g.peak_moment
        steady = len(held) > 1 and len(set(held.values())) == 1  # the same at every moment (a vLLM reservation)
        out.append((r.role, r.gpus, held.get(moment, 0), "every moment" if steady else moment, g.name))
    return out


def _when(moment: str) -> str:
    return moment if moment == "every moment" else f"at {moment}"


def print_summary(e) -> None:
    """A run with several roles: one line per role (GPUs, its own peak, when), then each GPU group's sum: the
    short answer the detail below explains."""
    con = console()
    con.print(f"roles of {e.scenario.method} (device total per GPU at each role's own peak):")
    rows = role_peaks(e)
    width = max(len(role) for role, *_ in rows)
    for role, gpus, peak, moment, _ in rows:
        con.print(f"  {role.ljust(width)}  {gpus:>3} GPU{'s' * (gpus != 1)}  {gib(peak):>7} GiB  {_when(moment)}")
    for g in e.groups:
        worst = "  <- worst" if len(e.groups) > 1 and g.name == e.worst_group else ""
        con.print(f"  group '{g.name}': {len(g.roles)} role(s) on {g.gpus} GPUs, {gib(g.peak)} of {gib(g.capacity)} "
                  f"GiB at {g.peak_moment}{worst}")


def print_roles(e) -> None:
    from rich.table import Table

    con = console()
    roles = Table(title=f"{e.scenario.method}: roles")
    for col in ("role", "model", "process", "GPU group", "trains", "placement", "rows x seq", "active GiB/GPU",
                "host GiB/node"):
        roles.add_column(col)
    for r in e.roles:
        roles.add_row(r.role, r.model, r.process, r.group, "yes" if r.trains else "no", r.engine,
                      f"{r.rows} x {r.seq_len}" if r.rows else "", gib(r.active.total), gib(r.host_per_node))
    show(con, roles)
    for g in e.groups:
        _print_group(con, g, worst=g.name == e.worst_group, band=e.band_fraction)
    if e.drivers:
        con.print("[bold]what drives the peak[/] (GiB): " + "; ".join(f"{k} {gib(v)}" for k, v in e.drivers.items()))
    if e.gpus_needed > e.scenario.world_size:
        con.print(f"[bold red]placement needs {e.gpus_needed} GPUs[/], the hardware has {e.scenario.world_size}")


def _print_group(con, g, worst: bool, band: float) -> None:
    from rich.table import Table

    verdict = verdict_of(g.margin_bytes, g.capacity, None, band)  # the run's rule, its band included
    mark = f"  [{VERDICT_STYLE[verdict]}]{'OVERFLOWS' if verdict == 'oom' else verdict}[/]" + \
        ("  <- worst GPU" if worst else "")
    t = Table(title=f"GPU group '{g.name}' ({g.gpus} GPUs, {len(g.processes)} processes per GPU): per-GPU sum by "
                    f"role at the peak moment '{g.peak_moment}', device total GiB")
    t.add_column("role")
    for c in CATEGORIES:
        t.add_column(SHORT[c], justify="right")
    t.add_column("total", justify="right")
    roles = g.moments[g.peak_moment]
    for role, b in roles.items():
        t.add_row(role, *(gib(b.get(c)) for c in CATEGORIES), gib(b.total))
    t.add_row("[bold]sum[/]", *(gib(sum(b.get(c) for b in roles.values())) for c in CATEGORIES),
              f"[bold]{gib(g.peak)}[/]")
    show(con, t)
    m = Table(title=f"GPU group '{g.name}': per-GPU device total by moment, GiB")
    m.add_column("moment")
    for role in g.roles:
        m.add_column(role, justify="right")
    m.add_column("sum", justify="right")
    for moment, by_role in g.moments.items():
        peak = " <- peak" if moment == g.peak_moment else ""
        m.add_row(moment + peak, *(gib(by_role[r].total) if r in by_role else "" for r in g.roles),
                  gib(sum(b.total for b in by_role.values())))
    show(con, m)
    con.print(f"group '{g.name}': peak {gib(g.peak)} of {gib(g.capacity)} GiB, margin {gib(g.margin_bytes)} GiB"
              + mark)
