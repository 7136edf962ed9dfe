"""The page of `memfit serve` (GET /): a verdict bar that stays in view (the command line's first line and the
changes that fit, each a button), the form beside the answer (the run, its defaults with their values, warnings,
charts, assumptions), a plan with its controls whose rows apply to the form, and the exports.

Every change of the form asks /api/answer (answer.py); the plan asks /api/plan_view (plan_view.py). One
self-contained page: the report's CSS, this page's CSS and script (page_script.py); nothing is fetched but the API.
"""
from __future__ import annotations

from html import escape

from memfit.interfaces.render.html import page as html_page
from memfit.interfaces.serve.page_script import SCRIPT

# the form's knobs, in the order shown (knob-table names; the rest of a file's knobs ride along unseen)
FORM_KNOBS = ("tuning", "zero_stage", "offload_optimizer", "checkpointing", "attention", "micro_batch", "seq_len",
              "precision")
ZERO_STAGES = (0, 1, 2, 3)
EXPORT_FORMATS = (("deepspeed", "DeepSpeed JSON"), ("llamafactory", "LLaMA-Factory YAML"),
                  ("openrlhf", "OpenRLHF command"), ("accelerate", "accelerate YAML"), ("hf", "HF / TRL arguments YAML"))
ALLOWED = (("lora", "LoRA"), ("qlora", "QLoRA"), ("8bit", "8-bit optimizer states"))

STYLE = """<style>
body { max-width: 1280px; }
:root { --control: #6e7781; } @media (prefers-color-scheme: dark) { :root { --control: #8b949e; } }
#bar { position: sticky; top: 0; z-index: 5; background: var(--bg); padding: 0.4em 0; }
#bar .verdict { margin: 0; padding: 0.45em 0.8em; font-weight: 600; }
#bar.stale .verdict { opacity: 0.45; }
#fixes { display: flex; flex-wrap: wrap; gap: 0.4em; margin: 0 0 0.8em; }
.layout { display: grid; grid-template-columns: minmax(260px, 340px) minmax(0, 1fr); gap: 1.2em; align-items: start; }
form#knobs { display: grid; gap: 0.5em; background: var(--panel); padding: 0.8em; border-radius: 6px; }
form#knobs label, .controls label { display: flex; flex-direction: column; font-size: 0.9em; color: var(--muted);
  gap: 0.15em; }
input, select { font: inherit; color: var(--fg); background: var(--bg); border: 1px solid var(--control);
  border-radius: 4px; padding: 0.3em 0.45em; min-height: 44px; box-sizing: border-box; max-width: 100%; }
input[type=file] { border: none; padding: 0; } input[type=checkbox] { min-height: 24px; min-width: 24px; }
[aria-invalid="true"] { border-color: var(--oom); outline: 2px solid var(--oom); }
.err { color: var(--oom); font-size: 0.85em; min-height: 1em; overflow-wrap: anywhere; }
.actions, .controls { display: flex; flex-wrap: wrap; gap: 0.6em; align-items: end; margin: 0.8em 0; }
.controls label.check { flex-direction: row; align-items: center; gap: 0.4em; min-height: 44px; }
button { font: inherit; min-height: 44px; padding: 0.3em 0.9em; border-radius: 4px; border: 1px solid var(--control);
  background: var(--panel); color: var(--fg); cursor: pointer; text-align: left; }
button.fix { border-color: var(--fits); }
#answer.stale, #plan.stale { opacity: 0.45; } #status { color: var(--muted); }
#warnings li { color: var(--tight); font-weight: 600; }
.table-wrap, #result table { max-width: 100%; overflow-x: auto; display: block; }
pre#export-text { background: var(--panel); padding: 0.6em; max-height: 18em; overflow: auto; font-size: 0.85em;
  white-space: pre-wrap; overflow-wrap: anywhere; }
.visually-hidden { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); }
main, section, #answer, #result { min-width: 0; overflow-wrap: anywhere; }
@media (max-width: 760px) {
  body { padding: 0.6em; } .layout { grid-template-columns: minmax(0, 1fr); }
  #bar .verdict { font-size: 0.9em; }
  #plan-table, #plan-table tbody, #plan-table tr, #plan-table td { display: block; width: auto; }
  #plan-table tr:first-child { display: none; }
  #plan-table tr { border: 1px solid var(--control); border-radius: 6px; margin: 0.5em 0; padding: 0.3em; }
  #plan-table td { border: none; text-align: left; padding: 0.15em 0.4em; }
  #plan-table td[data-label]::before { content: attr(data-label) ": "; color: var(--muted); }
}
</style>"""


def _options(values, selected=None, blank: str | None = "(profile default)") -> str:
    out = [f'<option value="">{escape(blank)}</option>'] if blank is not None else []
    for v in values:
        value, label = v if isinstance(v, tuple) else (v, v)
        chosen = " selected" if str(value) == str(selected) else ""
        out.append(f'<option value="{escape(str(value))}"{chosen}>{escape(str(label))}</option>')
    return "".join(out)


def _field(name: str, label: str, control: str, control_id: str | None = None) -> str:
    """A labelled control; `control_id`: the id of the control the label names (f-NAME unless given)."""
    return (f'<label for="{control_id or "f-" + name}">{escape(label)}{control}'
            f'<span class="err" data-for="{name}"></span></label>')


def _knob_control(name: str) -> str:
    from memfit.facts.knobs import knob

    k = knob(name)
    attrs = f'id="f-{name}" name="{name}" title="{escape(k.help)}"'
    if name == "zero_stage":
        return f"<select {attrs}>{_options(ZERO_STAGES)}</select>"
    if k.choices:
        return f"<select {attrs}>{_options(k.choices)}</select>"
    return f'<input {attrs} inputmode="numeric" placeholder="(profile default)">'


def form() -> str:
    from memfit.facts.catalog import gpus, models
    from memfit.facts.frameworks import frameworks

    model_ids = "".join(f'<option value="{escape(m.id)}">' for m in models())
    fields = [
        _field("model", "model (hub id or alias)", '<input id="f-model" name="model" list="models" '
               'placeholder="e.g. Qwen/Qwen2-7B-Instruct" autocomplete="off">'
               f'<datalist id="models">{model_ids}</datalist>'),
        _field("model_file", "or its config.json", '<input id="model-file" type="file" accept=".json">',
               "model-file"),
        _field("gpu", "GPU", f'<select id="f-gpu" name="gpu">{_options([(g.id, g.name) for g in gpus()], "rtx4090", None)}'
               "</select>"),
        _field("gpus_per_node", "GPUs per node", '<input id="f-gpus_per_node" name="gpus_per_node" value="1" '
               'inputmode="numeric">'),
        _field("nodes", "nodes", '<input id="f-nodes" name="nodes" placeholder="1" inputmode="numeric">'),
        _field("host_ram", "host RAM per node", '<input id="f-host_ram" name="host_ram" placeholder="e.g. 256GiB">'),
        _field("profile", "framework profile", f'<select id="f-profile" name="profile">'
               f'{_options(sorted(frameworks()), blank="hf-trainer (default)")}</select>'),
    ]
    fields += [_field(name, name.replace("_", " "), _knob_control(name)) for name in FORM_KNOBS]
    fields.append(_field("framework_file", "fill from a framework config", '<input id="framework-file" type="file" '
                         'accept=".yaml,.yml,.json,.sh,.txt">', "framework-file"))
    fields.append('<p id="imported" class="note"></p><button type="button" id="clear-file">forget the file\'s '
                  "other knobs</button>")
    return f'<form id="knobs" autocomplete="off" aria-label="the run">{"".join(fields)}</form>'


def bar() -> str:
    return ('<div id="bar" class="stale"><div class="verdict" id="verdict-bar"><span class="word" id="verdict-word">'
            '</span> <span id="headline">name a model to start</span></div>'
            '<p class="visually-hidden" id="live" aria-live="polite" role="status"></p></div><div id="fixes"></div>')


def answer_section() -> str:
    return ('<section id="answer" class="stale" aria-label="the answer"><p id="status"></p>'
            '<p class="err" id="general-error" role="alert"></p><ul id="warnings"></ul><p id="summary"></p>'
            '<p id="next" class="note"></p><div id="result"></div><div id="lists"></div></section>')


def plan_section() -> str:
    allowed = "".join(f'<label class="check" for="allow-{v}"><input type="checkbox" id="allow-{v}" '
                      f'name="allow" value="{v}">{escape(label)}</label>' for v, label in ALLOWED)
    return ('<section aria-labelledby="plan-title"><h2 id="plan-title">plan: the fastest configurations that fit</h2>'
            f'<div class="controls" id="plan-controls"><span class="note">changes you accept:</span>{allowed}'
            '<label for="global-batch">global batch (kept)<input id="global-batch" inputmode="numeric" '
            'placeholder="the form\'s"></label><span class="err" data-for="global_batch"></span>'
            '<button type="button" id="plan-button">plan</button></div>'
            '<h3 id="plan-heading"></h3><div id="plan"></div></section>')


def export_section() -> str:
    return ('<section aria-labelledby="export-title"><h2 id="export-title">export and report</h2><div class="actions">'
            f'<label for="format">file format<select id="format">{_options(EXPORT_FORMATS, blank=None)}</select></label>'
            '<span class="err" data-for="format"></span>'
            '<button type="button" id="export">export the config</button>'
            '<button type="button" id="report">download the HTML report</button></div>'
            '<p id="export-note" class="note"></p><pre id="export-text"></pre></section>')


def page() -> str:
    body = [STYLE, "<h1>memfit: will this fine-tuning run fit?</h1>", bar(),
            '<main class="layout">', form(), "<div>", answer_section(), plan_section(), export_section(), "</div>",
            "</main>", SCRIPT]
    return html_page("memfit serve", body)
