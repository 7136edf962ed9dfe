"""The page of `memfit serve` (GET /): a form of the model, the GPUs and the main knobs whose every change asks
/api/chart for the estimate's verdict and bars (render/html.py draws them, as in the HTML report), an upload that
fills the form from a framework file (/api/import), and buttons for the exported config and the report.

One self-contained page: the report's CSS, and the small script below; nothing is fetched but the API.
"""
from __future__ import annotations

from html import escape

from memfit.interfaces.render.html import page as html_page

# the form's knobs, in the order shown (knob-table names; the rest of a file's knobs ride along unseen)
FORM_KNOBS = ("tuning", "zero_stage", "offload_optimizer", "checkpointing", "attention", "micro_batch", "seq_len",
              "precision")
ZERO_STAGES = (0, 1, 2, 3)
EXPORT_FORMATS = (("deepspeed", "DeepSpeed JSON"), ("llamafactory", "LLaMA-Factory YAML"),
                  ("openrlhf", "OpenRLHF command"), ("accelerate", "accelerate YAML"), ("hf", "HF TrainingArguments"))

STYLE = """<style>
form#knobs { display: grid; grid-template-columns: repeat(auto-fill, minmax(230px, 1fr)); gap: 0.6em 1.2em;
  background: var(--panel); padding: 0.9em; border-radius: 6px; }
form#knobs label { display: flex; flex-direction: column; font-size: 0.9em; color: var(--muted); gap: 0.15em; }
form#knobs input, form#knobs select { font: inherit; color: var(--fg); background: var(--bg);
  border: 1px solid var(--grid); border-radius: 4px; padding: 0.25em 0.4em; }
form#knobs [aria-invalid="true"] { border-color: var(--oom); }
.err { color: var(--oom); font-size: 0.85em; min-height: 1em; }
.actions { display: flex; flex-wrap: wrap; gap: 0.8em; align-items: center; margin: 0.8em 0; }
button { font: inherit; padding: 0.3em 0.9em; border-radius: 4px; border: 1px solid var(--grid);
  background: var(--panel); color: var(--fg); cursor: pointer; }
#result.stale, #plan.stale { opacity: 0.45; } #status { color: var(--muted); }
pre#export-text { background: var(--panel); padding: 0.6em; max-height: 18em; overflow: auto; font-size: 0.85em; }
</style>"""

SCRIPT = """<script>
"use strict";
const form = document.getElementById("knobs");
const result = document.getElementById("result");
let uploadedModel = null;   // a config.json sent as an object (never a path)
let fromFile = {};          // knobs of an imported file that the form has no field for
let asked = 0;

function request() {
  const body = {};
  for (const el of form.elements) {
    if (el.name && el.type !== "file" && el.value !== "") body[el.name] = el.value;
  }
  for (const [k, v] of Object.entries(fromFile)) if (!(k in body)) body[k] = v;
  if (uploadedModel) { body.model = uploadedModel.config; body.model_name = uploadedModel.name; }
  return body;
}

function clearErrors() {
  for (const el of document.querySelectorAll(".err")) el.textContent = "";
  for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
}

function showError(err) {
  const beside = err.field && document.querySelector('.err[data-for="' + CSS.escape(err.field) + '"]');
  (beside || document.getElementById("general-error")).textContent = err.error;
  const input = err.field && form.elements[err.field];
  if (input && input.setAttribute) input.setAttribute("aria-invalid", "true");
}

async function post(url, body) {
  const r = await fetch(url, {method: "POST", headers: {"content-type": "application/json"},
                              body: JSON.stringify(body)});
  if (!r.ok) {
    let err;
    try { err = await r.json(); } catch (e) { err = {error: r.status + " " + r.statusText, field: null}; }
    throw err;
  }
  return r;
}

async function update() {
  const mine = ++asked;
  clearErrors();
  const body = request();
  if (!body.model) { document.getElementById("status").textContent = "name a model to start"; return; }
  document.getElementById("status").textContent = "estimating...";
  try {
    const html = await (await post("/api/chart", body)).text();
    if (mine !== asked) return;   // a newer change is on its way
    result.innerHTML = html;
    result.classList.remove("stale");
    document.getElementById("status").textContent = "";
    if (planOpen) plan();
  } catch (err) {
    if (mine !== asked) return;
    result.classList.add("stale");
    document.getElementById("status").textContent = "not estimated: see the message beside the field";
    showError(err);
  }
}

let planOpen = false;        // once asked for, the plan follows the knobs too

async function plan() {
  const mine = asked;
  const view = document.getElementById("plan");
  view.classList.add("stale");
  try {
    const html = await (await post("/api/plan.html", request())).text();
    if (mine !== asked) return;
    view.innerHTML = html;
    view.classList.remove("stale");
  } catch (err) { if (mine === asked) { view.innerHTML = ""; showError(err); } }
}

function download(name, text, type) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(new Blob([text], {type: type}));
  a.download = name;
  document.body.appendChild(a); a.click(); a.remove();
}

function setField(name, value) {
  const el = form.elements[name];
  if (!el) return false;
  const text = Array.isArray(value) ? value.join(",") : String(value);
  if (el.tagName === "SELECT" && ![...el.options].some(o => o.value === text)) el.add(new Option(text, text));
  el.value = text;
  return true;
}

async function importFile(file) {
  clearErrors();
  try {
    const doc = await (await post("/api/import", {name: file.name, text: await file.text()})).json();
    fromFile = {};
    for (const [k, v] of Object.entries(doc.knobs)) if (!setField(k, v)) fromFile[k] = v;
    if (doc.unread.length) fromFile.unread = doc.unread;  // what memfit could not read caps every verdict
    if (doc.model) { uploadedModel = null; setField("model", doc.model); }
    if (doc.profile) setField("profile", doc.profile);
    const extra = Object.entries(fromFile).filter(([k]) => k !== "unread")
      .map(([k, v]) => k + "=" + JSON.stringify(v)).join(", ");
    document.getElementById("imported").textContent = doc.name + " (" + doc.format + ")" +
      (extra ? "; also from the file: " + extra : "");
    await update();
  } catch (err) { showError({error: err.error || String(err), field: "framework_file"}); }
}

form.addEventListener("change", e => { if (e.target.type !== "file") update(); });
form.addEventListener("submit", e => { e.preventDefault(); update(); });
form.elements.model.addEventListener("input", () => { uploadedModel = null; });
document.getElementById("model-file").addEventListener("change", async e => {
  const file = e.target.files[0];
  if (!file) return;
  try {
    uploadedModel = {name: file.name, config: JSON.parse(await file.text())};
    form.elements.model.value = "";
    update();
  } catch (err) { showError({error: file.name + ": not JSON: " + err.message, field: "model"}); }
});
document.getElementById("framework-file").addEventListener("change", e => {
  if (e.target.files[0]) importFile(e.target.files[0]);
});
document.getElementById("clear-file").addEventListener("click", () => {
  fromFile = {}; document.getElementById("imported").textContent = ""; update();
});
document.getElementById("export").addEventListener("click", async () => {
  clearErrors();
  const format = document.getElementById("format").value;
  try {
    const doc = await (await post("/api/export", Object.assign(request(), {format: format}))).json();
    document.getElementById("export-text").textContent = doc.files.map(f => "# " + f.name + "\\n" + f.text).join("\\n");
    for (const f of doc.files) download(f.name, f.text, "text/plain");
  } catch (err) { showError(err); }
});
document.getElementById("plan-button").addEventListener("click", () => { planOpen = true; clearErrors(); plan(); });
document.getElementById("report").addEventListener("click", async () => {
  clearErrors();
  try {
    download("memfit-report.html", await (await post("/api/report.html", request())).text(), "text/html");
  } catch (err) { showError(err); }
});
update();
</script>"""


def _options(values, selected=None, blank: str | None = "(profile default)") -> str:
    out = [f'<option value="">{escape(blank)}</option>'] if blank is not None else []
    for v in values:
        value, label = v if isinstance(v, tuple) else (v, v)
        chosen = " selected" if str(value) == str(selected) else ""
        out.append(f'<option value="{escape(str(value))}"{chosen}>{escape(str(label))}</option>')
    return "".join(out)


def _field(name: str, label: str, control: str) -> str:
    return (f'<label for="f-{name}">{escape(label)}{control}<span class="err" data-for="{name}"></span></label>')


def _knob_control(name: str) -> str:
    from memfit.facts.knobs import knob

    k = knob(name)
    if name == "zero_stage":
        return f'<select id="f-{name}" name="{name}" title="{escape(k.help)}">{_options(ZERO_STAGES)}</select>'
    if k.choices:
        return f'<select id="f-{name}" name="{name}" title="{escape(k.help)}">{_options(k.choices)}</select>'
    return (f'<input id="f-{name}" name="{name}" inputmode="numeric" placeholder="{escape(str(k.default or ""))}" '
            f'title="{escape(k.help)}">')


def form() -> str:
    from memfit.facts.catalog import gpus, models
    from memfit.facts.frameworks import frameworks

    model_ids = "".join(f'<option value="{escape(m.id)}">' for m in models())
    fields = [
        _field("model", "model (hub id or alias)", '<input id="f-model" name="model" list="models" '
               'placeholder="e.g. Qwen/Qwen2-7B-Instruct" autocomplete="off">'
               f'<datalist id="models">{model_ids}</datalist>'),
        _field("model_file", "or its config.json", '<input id="model-file" type="file" accept=".json">'),
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
                         'accept=".yaml,.yml,.json,.sh,.txt">'))
    return f'<form id="knobs" autocomplete="off">{"".join(fields)}</form>'


def page() -> str:
    body = [STYLE, "<h1>memfit: will this fine-tuning run fit?</h1>", form(),
            '<p id="imported" class="note"></p>',
            '<div class="actions"><button type="button" id="clear-file">forget the file\'s other knobs</button>'
            f'<select id="format">{_options(EXPORT_FORMATS, blank=None)}</select>'
            '<button type="button" id="export">export the config</button>'
            '<button type="button" id="report">download the HTML report</button>'
            '<button type="button" id="plan-button">plan: the fastest configurations that fit</button>'
            '<span id="status"></span></div>',
            '<p class="err" id="general-error"></p>', '<div id="result"></div>', '<div id="plan"></div>', '<pre id="export-text"></pre>',
            SCRIPT]
    return html_page("memfit serve", body)
