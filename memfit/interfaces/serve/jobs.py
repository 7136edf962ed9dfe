"""The work behind each API route, as plain functions of the parsed request body (no web framework here): the
worker processes (workers.py) run them by name, and tests call them directly.

Every answer is one of memfit's own documents (`estimate --json`, `plan --json`, the HTML report) or the page's
views of them (answer.py, plan_view.py).
"""
from __future__ import annotations

import re

from memfit.errors import MemfitError

from memfit.interfaces.formats.base import shown
from memfit.interfaces.serve import requests, uploads

# the framework profile each export format's file runs under, when the form left the profile at its default: the
# file then carries that framework's defaults, not hf-trainer's (which an OpenRLHF command cannot say)
FORMAT_PROFILES = {"openrlhf": "openrlhf", "llamafactory": "llamafactory", "hf": "trl"}
HF_VARIANTS = {"trl": "sft", "hf-trainer": "training_args"}  # hf format: TRL's SFTConfig or plain TrainingArguments


def estimate_doc(body) -> dict:
    """The document `memfit estimate --json` prints: the memory answer and the step-time model's (no run size
    here: the page has no --tokens field)."""
    from memfit.planner.throughput import speed_json
    from memfit.roles.estimate import estimate

    result = estimate(requests.scenario(body))
    return result.to_json() | {"speed": speed_json(result.scenario, None)}


def chart_html(body) -> str:
    from memfit.interfaces.render.html import estimate_body

    return "\n".join(estimate_body(estimate_doc(body)))


def report_html(body) -> str:
    from memfit.interfaces.render.html import estimate_page

    return estimate_page(estimate_doc(body))


def plan_options(body):
    """The plan request's start, allowed changes, global batch, rows wanted and options."""
    from memfit.planner.plan import Options

    base = requests.scenario(body, requests.EXTRA_KEYS["plan"])
    b = requests.canonical(body, requests.EXTRA_KEYS["plan"])
    allow = b.get("allow") or []
    allow = allow.split(",") if isinstance(allow, str) else allow
    if not isinstance(allow, list) or not all(isinstance(x, str) for x in allow):
        raise requests.FieldError("allow: a list of changes you accept (lora, qlora, 8bit)", "allow")
    allow = {x.strip() for x in allow if x.strip()}
    batch = positive(b, "global_batch", None)
    top = min(positive(b, "top", 5), 20)
    options = Options(code_edits=not b.get("no_code_edits"), resume=not b.get("no_resume"))
    return base, allow, batch, top, options


def plan_doc(body) -> dict:
    from memfit.interfaces.cli.plan import plan_json
    from memfit.planner.plan import baseline, closest_miss, search_plans

    base, allow, batch, top, options = plan_options(body)
    searched = search_plans(base, allow, batch, top_k=top, options=options)
    rows = searched.rows
    start = baseline(base, batch, options)
    miss = None if rows else closest_miss(base, allow, batch, options)
    return plan_json(start, rows, miss, options, searched)


def plan_table_html(body) -> str:
    from memfit.interfaces.render.html import plan_table

    return plan_table(plan_doc(body))


def export_doc(body) -> dict:
    """The form's run as a framework file. A profile the form left at its default becomes the format's own
    framework (so the file holds what that framework does by default); a value the user set that the format
    cannot say is one line naming that field."""
    keys = requests.EXTRA_KEYS["export"]
    b = requests.canonical(body, keys)
    fmt = b.get("format", "deepspeed")
    chosen = b.get("profile") not in (None, "")
    profile = b["profile"] if chosen else FORMAT_PROFILES.get(fmt)
    sent = {k: v for k, v in body.items() if requests.spellings().get(k) != "profile"}
    s = requests.scenario(sent | ({"profile": profile} if profile else {}), keys)
    options = {"variant": HF_VARIANTS.get(s.profile, "sft")} if fmt == "hf" else {}
    try:
        out = uploads.export(s, fmt, **options)
    except requests.FieldError:
        raise
    except MemfitError as e:  # "<hf text>: cannot write loss='standard' in a hf config: ..."
        m = re.search(r"cannot write (\w+)=", str(e))
        field = m.group(1) if m else None
        why = str(e).split(": ", 1)[-1].split(" in a ", 1)[0].replace("cannot write ", "")
        whose = f" (the {s.profile} profile's default)" if field and field not in b else ""
        raise requests.FieldError(f"{uploads.FORMAT_NAMES.get(fmt, fmt)} cannot say {why}{whose}: "
                                  f"{str(e).rsplit(': ', 1)[-1]}; set {field or 'it'} in the form or pick another "
                                  "format", field) from None
    return out | {"profile": s.profile, "model": s.model.id}


def positive(b: dict, key: str, default):
    value = b.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 2**31:
        raise requests.FieldError(f"{key} must be a positive integer up to 2^31, got {shown(value)}", key)
    return value
