"""The page's plan (/api/plan_view): `memfit plan --json`'s rows as a table a person reads ("needs 26.8 GiB more",
"12% slower"), each row with the form fields an "apply this row" button sets, and, when nothing fits on the GPUs
given, how many GPUs of this kind the fastest configuration needs (the same search with more GPUs per node, then
more nodes). No web framework here.
"""
from __future__ import annotations

import json
from html import escape

from memfit.interfaces.serve import jobs, requests

GiB = 2**30
MORE_GPUS = ((2, 1), (4, 1), (8, 1), (8, 2), (8, 4), (8, 8))  # (GPUs per node, nodes) tried when nothing fits
SKIPPED = {"global_batch", "sharding"}  # the plan's own words, not knobs; global_batch is micro x accum x GPUs


def plan_answer(body) -> dict:
    doc = jobs.plan_doc(body)
    more = None if doc["rows"] else more_gpus(body, doc)
    return {"heading": heading(doc, more), "html": table(body, doc, more), "found": len(doc["rows"]), "more_gpus": more,
            "warnings": doc["warnings"]}


def more_gpus(body, doc) -> dict | None:
    """The fewest GPUs of this kind on which the plan finds a configuration that fits (None: not up to 64)."""
    world = doc["gpus_per_node"] * doc["nodes"]
    for per_node, nodes in MORE_GPUS:
        if per_node * nodes <= world:
            continue
        wider = {k: v for k, v in body.items() if requests.spellings().get(k) not in ("gpus_per_node", "nodes")}
        found = jobs.plan_doc(wider | {"gpus_per_node": per_node, "nodes": nodes, "top": 1})
        if found["rows"]:
            return {"gpus_per_node": per_node, "nodes": nodes, "gpus": per_node * nodes, "row": found["rows"][0]}
    return None


def heading(doc: dict, more: dict | None) -> str:
    where = f"{doc['gpus_per_node'] * doc['nodes']} x {doc['gpu']}"
    n = len(doc["rows"])
    if n:
        return f"plan: {n} configuration{'s' * (n != 1)} that fit on {where}, fastest first"
    if more:
        return (f"plan: nothing fits on {where}; it needs {more['gpus']} GPUs of this kind "
                f"({more['gpus_per_node']} per node x {more['nodes']} node{'s' * (more['nodes'] != 1)})")
    return f"plan: nothing fits on {where}, nor on up to 64 of them; allow LoRA or QLoRA, or a larger GPU"


def row_fields(body, start: dict, config: dict) -> dict | None:
    """A plan row's changes from the start as the form's fields (None: back to the profile's default), as the
    form accepts them: a knob the form refuses as having no effect there is left out; None when the form, so
    changed, would not be read at all (then the row has no button)."""
    from memfit.errors import MemfitError

    names = requests.spellings()
    fields = {k: v for k, v in config.items()
              if k in names and k not in SKIPPED and v != start["config"].get(k)}
    for _ in range(4):
        try:
            requests.scenario(_with(body, fields), requests.EXTRA_KEYS["plan"])
            return fields
        except requests.FieldError as e:
            if e.field not in fields:
                return None
            del fields[e.field]
        except MemfitError:  # an error about no one field: the form would not be read
            return None  # "--checkpoint-every-n has no effect here": the row's value of it is inert
    return None


def _with(body, fields: dict) -> dict:
    from memfit.interfaces.serve.answer import _with as applied

    return {k: v for k, v in applied(body, fields).items() if v is not None}


def table(body, doc: dict, more: dict | None) -> str:
    start = doc["start"]
    start_fits = start["verdict"] == "fits"
    rows = [_row("start", start, start_fits, None)]
    rows += [_row(str(i), r, start_fits, row_fields(body, start, r["config"])) for i, r in enumerate(doc["rows"], 1)]
    if more:
        wider = {"gpus_per_node": more["gpus_per_node"], "nodes": more["nodes"]}
        fields = row_fields(_with(body, wider), start, more["row"]["config"])
        rows.append(_row(f"on {more['gpus']} GPUs", more["row"], start_fits,
                         None if fields is None else wider | fields))
    elif not doc["rows"] and doc.get("closest_miss"):
        rows.append(_row("closest miss", doc["closest_miss"], start_fits, None))
    head = "".join(f"<th scope=\"col\">{h}</th>" for h in ("#", "verdict", "GiB per GPU", "speed", "changes", ""))
    return f'<div class="table-wrap"><table id="plan-table"><tr>{head}</tr>{"".join(rows)}</table></div>'


def _row(label: str, r: dict, start_fits: bool, fields: dict | None) -> str:
    """A table row; `fields`: what its "apply this row" button sets in the form (None: no button)."""
    changes = "".join(f"<li>{escape(change_words(c, start_fits))}</li>" for c in r["changes"]) or "<li>none</li>"
    button = (f'<button type="button" class="apply-row" data-fields="{escape(json.dumps(fields))}">apply this row'
              "</button>" if fields is not None else "")
    room = r["headroom_bytes"]
    spare = f"{room / GiB:.1f} to spare" if room >= 0 else f"needs {-room / GiB:.1f} more"
    return (f'<tr class="plan-row" data-row="{escape(label)}"><td data-label="#">{escape(label)}</td>'
            f'<td data-label="verdict" class="{escape(r["verdict"])}">{escape(r["verdict"])}</td>'
            f'<td data-label="GiB per GPU">{r["device_peak_bytes"] / GiB:.1f} ({spare})</td>'
            f'<td data-label="speed">{r["tokens_per_second"]:,.0f} tokens/s</td>'
            f'<td class="text"><ul class="changes">{changes}</ul></td><td>{button}</td></tr>')


def change_words(c: dict, start_fits: bool) -> str:
    """One change of a plan row as a person reads it: what it does to memory and to speed."""
    from memfit.interfaces.serve.answer import speed_words

    saving = c["device_saving_bytes"]
    memory = (f"saves {saving / GiB:.1f} GiB per GPU" if saving > 0.05 * GiB else
              f"needs {-saving / GiB:.1f} GiB more per GPU" if saving < -0.05 * GiB else "about the same memory")
    memory = f"alone {memory}" if c["measured"] == "alone" and saving < -0.05 * GiB else memory
    why = " (needed to fit)" if c["needed_to_fit"] and not start_fits else ""
    edit = " (needs a code edit: no flag)" if c.get("code_edit") else ""
    return (f"{c['knob'].replace('_', ' ')} {c['before']} \u2192 {c['after']}: {memory}, "
            f"{speed_words(c['speed_cost_pct'] / 100)}{why}{edit}")
