"""What a log alone says to do: the one-line answer (what ran out, in which phase, the size asked against what
was free) and the generic fixes for that failure, ranked by the rules of memfit/facts/data/log_fixes.toml.
No config here: with one, diagnose.py ranks memfit's own fixes by its estimate."""
from __future__ import annotations

from memfit.facts.data_table import data_table
from memfit.interfaces.logs.parse import Failure

GiB, MiB, KiB = 2**30, 2**20, 2**10
ANY = "any"


def table() -> dict:
    return data_table("log_fixes.toml")


def size(n: int | None, digits: int = 2) -> str:
    """Bytes as the OOM message prints them: GiB from a tenth of one, else MiB or KiB (0.02 GiB says nothing)."""
    if n is None:
        return "?"
    if n == 0:
        return "0 bytes"
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit / 10:
            return f"{n / unit:,.{digits}f} {name}"
    return f"{n} bytes"


def phase_words(phase: str | None) -> str:
    return f" {table()['phase'].get(phase, 'at ' + phase)}" if phase else ""


# ---------------------------------------------------------------- the answer

def headline(f: Failure) -> str:
    """The answer: what ran out, where, and the figures that say by how much."""
    where = phase_words(f.phase)
    if f.kind == "cuda_oom":
        return _cuda_headline(f, where)
    if f.kind == "host_oom":
        return _host_headline(f, where)
    if f.form == "nccl-shm":
        return f"NCCL ran out of shared memory{where}: /dev/shm is too small for its segment"
    return f"NCCL ran out of GPU memory{where}: the GPU was full when NCCL allocated its buffers"


def _cuda_headline(f: Failure, where: str) -> str:
    if f.total_bytes is None:
        asked = f": asked {size(f.tried_to_allocate_bytes)}" if f.tried_to_allocate_bytes else ""
        return f"CUDA OOM{where}{asked}; the message gives no other figures"
    held = ""
    if f.allocated_bytes is not None:
        held = f" ({size(f.allocated_bytes, 1)} allocated by PyTorch"
        if f.reserved_unallocated_bytes is not None:
            held += f", {size(f.reserved_unallocated_bytes, 1)} reserved but unallocated"
        held += ")"
    return (f"CUDA OOM{where}: asked {size(f.tried_to_allocate_bytes)} with {size(f.free_bytes)} free of "
            f"{size(f.total_bytes)}{held}")


def _host_headline(f: Failure, where: str) -> str:
    if f.form == "default-cpu-allocator":
        return f"host RAM ran out{where}: a host allocation of {size(f.tried_to_allocate_bytes)} failed"
    if f.form == "kernel-oom-killer":
        held = f" holding {size(f.allocated_bytes)} resident" if f.allocated_bytes else ""
        return f"host RAM ran out{where}: the kernel's OOM killer killed the training process{held}"
    if f.form == "ray-memory-monitor":
        used = f" at {size(f.allocated_bytes)} used of {size(f.total_bytes)}" if f.total_bytes else ""
        return f"host RAM ran out{where}: Ray's memory monitor killed a worker{used}"
    # a SIGKILL names no cause: on Linux it is almost always the kernel's OOM killer, which logs to dmesg only
    return f"host RAM ran out{where}, most likely: a process was killed by SIGKILL (-9)"


def where_line(f: Failure) -> str:
    """Where the failure is, beside the answer: the GPU, the component, the log line."""
    rank = f" (rank {f.rank})" if f.rank is not None else ""
    parts = [f"GPU {f.gpu}{rank}"] if f.kind == "cuda_oom" and f.gpu is not None else [f"rank {f.rank}"] if rank \
        else []
    if f.component:
        parts.append(f.component)
    if not f.phase:
        parts.append("no phase in the log (no traceback or progress line before it)")
    return "where: " + ", ".join(parts) + ("; " if parts else "") + f"line {f.line} of the log"


# ---------------------------------------------------------------- generic fixes

def _slack(f: Failure) -> bool:
    t = table()["thresholds"]
    unalloc, tried = f.reserved_unallocated_bytes or 0, f.tried_to_allocate_bytes or 0
    return bool(tried) and unalloc >= t["slack_min_bytes"] and unalloc >= t["slack_share_of_request"] * tried


def _names(words: str):
    """A condition on the component the traceback named (failure_sites.toml's component words)."""
    return lambda f: words in (f.component or "")


# the conditions log_fixes.toml names; each reads only the failure's own figures or its traceback's component
CONDITIONS = {
    "fragmented": lambda f: f.fragmentation,
    "slack": _slack,
    "logits": _names("logits"),
    "attention": _names("attention scores"),
}


def rule_for(f: Failure) -> dict | None:
    rules = [r for r in table()["rule"] if r["kind"] == f.kind]
    return next((r for r in rules if r["phase"] == f.phase), None) or \
        next((r for r in rules if r["phase"] == ANY), None)


def generic_fixes(f: Failure) -> list[dict]:
    """The rule's fixes for this failure, best first: those whose condition holds moved to the top, those
    offered only under a condition that does not hold left out."""
    rule = rule_for(f)
    if rule is None:
        return []
    rows = [(name, table()["fix"][name]) for name in rule["fixes"]]
    rows = [(n, r) for n, r in rows if "when" not in r or CONDITIONS[r["when"]](f)]
    first = [(n, r) for n, r in rows if "first_when" in r and CONDITIONS[r["first_when"]](f)]
    return [_fix(n, r) for n, r in first + [x for x in rows if x not in first]]


def _fix(name: str, row: dict) -> dict:
    # "changes" stay empty: without the config there is no before and after to write (see "knobs")
    return {"fix": row["text"], "from": "rule", "id": name, "changes": [], "knobs": dict(row.get("knobs", {})),
            "env": dict(row["env"]) if "env" in row else None, "why": row["why"]}
