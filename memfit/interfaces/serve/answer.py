"""The page's answer to one form (/api/answer): the command line's first line (its verdict bar), the run summary,
each profile default with its value, the warnings, and when the run does not fit (or is tight) the cheapest
changes that fit as form fields a button applies. No web framework here (tests call it directly).

The next steps are the planner's (memfit/planner/next_steps.py, as `memfit estimate` prints them); each is read
back through the request path (requests.scenario of the form with the change applied) and estimated again, so a
button offers only what the same form, sent again, answers "fits".
"""
from __future__ import annotations

from memfit.errors import MemfitError
from memfit.interfaces.serve import requests

SHOWN = 3  # buttons offered, as the command line shows three flag sets
SHORT_NAMES = {"offload_optimizer": "optimizer offload", "offload_param": "parameter offload",
               "zero_stage": "ZeRO stage", "micro_batch": "micro-batch", "grad_accum": "grad accumulation",
               "seq_len": "sequence length", "fsdp_strategy": "FSDP strategy"}


def answer(body) -> dict:
    """The estimate of the form `body` and everything the page shows beside it."""
    from memfit.facts.profiles import beyond_positions
    from memfit.interfaces.render.html import estimate_body
    from memfit.interfaces.render.estimate import _setup_line
    from memfit.planner.throughput import speed_json
    from memfit.roles.estimate import estimate

    s = requests.scenario(body)
    result = estimate(s)
    doc = result.to_json() | {"speed": speed_json(result.scenario, None)}
    steps = next_steps(body, result) if result.verdict != "fits" else []
    hw = s.hardware
    return {"verdict": result.verdict, "headline": headline(result), "model": s.model.id,
            "summary": f"{s.model.id} on {hw.gpus_per_node} x {hw.gpu.name}" + (
                f" per node, {hw.nodes} nodes" if hw.nodes > 1 else "") + f"; profile {s.profile}; {_setup_line(s)}",
            "warnings": beyond_positions(s) + [f"not read: {u}" for u in s.unread],
            "assumptions": doc["assumptions"], "defaults": defaults(body, s),
            "next_steps": steps, "next": next_line(result.verdict, steps, s),
            "html": "\n".join(estimate_body(doc)[1:])}  # the bars and tables; the verdict is the bar's


def headline(result) -> str:
    """`memfit estimate`'s first line, as plain text."""
    from rich.text import Text

    from memfit.interfaces.render.estimate import answer_line

    return Text.from_markup(answer_line(result)).plain


def defaults(body, s) -> dict:
    """The form's knobs the user left empty -> the value the profile gave them (shown beside "profile default")."""
    from memfit.interfaces.serve.page import FORM_KNOBS

    given = requests.canonical(body)
    return {name: _json(getattr(s, name)) for name in FORM_KNOBS if name not in given and hasattr(s, name)}


def next_steps(body, result) -> list[dict]:
    """Up to SHOWN changes that fit, each as {"fields": form values, "label": words, ...}, cheapest first."""
    from memfit.planner.next_steps import cheapest_changes
    from memfit.roles.estimate import estimate

    out = []
    for change in cheapest_changes(result.scenario):
        fields = {name: _json(value) for name, value in change.fields.items()}
        try:
            again = estimate(requests.scenario(_with(body, fields)))
        except MemfitError:  # the form refuses this combination: not a button to offer
            continue
        if again.verdict != "fits":
            continue
        out.append({"fields": fields, "label": change_words(result.scenario, fields),
                    "device_total_bytes": again.device_total.peak.total, "speed_cost": round(change.speed_cost, 4),
                    "effect": f"{again.device_total.peak.total / 2**30:.1f} GiB per GPU, fits, "
                              f"{speed_words(change.speed_cost)}"})
        if len(out) == SHOWN:
            break
    return sorted(out, key=lambda st: st["speed_cost"])


def _with(body: dict, fields: dict) -> dict:
    """The form with a change applied: the change's knobs replace any spelling of them the form had."""
    names = requests.spellings()
    kept = {k: v for k, v in body.items() if names.get(k, k) not in fields}
    return kept | fields


SHARDING = ("engine", "zero_stage", "fsdp_strategy")  # one choice in words: "FSDP full_shard instead of ZeRO-2"


def change_words(s, fields: dict) -> str:
    """A change as a person says it: "checkpointing off -> full", "FSDP full_shard instead of ZeRO-2"."""
    words = []
    if any(k in fields for k in SHARDING):
        now = {k: getattr(s, k, None) for k in SHARDING}
        words.append(f"{_sharding(now | {k: v for k, v in fields.items() if k in SHARDING})} instead of "
                     f"{_sharding(now)}")
    words += [f"{SHORT_NAMES.get(k, k.replace('_', ' '))} {_word(getattr(s, k, None))} \u2192 {_word(v)}"
              for k, v in fields.items() if k not in SHARDING]
    return ", ".join(words)


def _sharding(v: dict) -> str:
    engine = v.get("engine")
    if engine == "deepspeed":
        return f"ZeRO-{v.get('zero_stage')}"
    if engine == "fsdp":
        return f"FSDP {v.get('fsdp_strategy') or 'full_shard'}"
    plain = {"ddp": "DDP", "single": "one GPU"}
    return plain.get(engine, str(engine)) if isinstance(engine, str) else str(engine)


def _word(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def speed_words(cost: float) -> str:
    """A share of the start's tokens/s as a person says it: "12% slower", "3% faster", "about as fast"."""
    if abs(cost) < 0.005:
        return "about as fast"
    return f"{abs(cost):.0%} slower" if cost > 0 else f"{abs(cost):.0%} faster"


def next_line(verdict: str, steps: list[dict], s) -> str:
    if verdict == "fits":
        return "next: export the config and launch it; or plan for faster configurations that fit"
    if s.unread:
        return (f"next: state the {len(s.unread)} setting(s) memfit could not read in a form it reads, or remove "
                "them, and estimate again")
    if steps:
        return "next: apply one of these changes (each fits; cheapest first), or plan for more"
    allow = ("QLoRA or 8-bit optimizer states" if s.tuning == "lora" else "8-bit optimizer states"
             if s.tuning == "qlora" else "LoRA or QLoRA")
    return f"next: no change of one or two knobs fits with this method; plan, allowing {allow}"


def _json(value):
    return list(value) if isinstance(value, tuple) else value


