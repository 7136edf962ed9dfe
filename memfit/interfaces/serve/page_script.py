"""The script of `memfit serve`'s page (page.py): it sends the form to the API and shows the answers. It computes
nothing; every number and word comes from the API (answer.py, plan_view.py). Values are set as text, never as HTML,
except the server's own escaped fragments (charts, plan table)."""

SCRIPT = """<script>
"use strict";
const form = document.getElementById("knobs");
const $ = id => document.getElementById(id);
let uploadedModel = null;   // a config.json sent as an object (never a path)
let fromFile = {};          // knobs of an imported file (or an applied change) that the form has no field for
let asked = 0;
let planOpen = false;       // once asked for, the plan follows the form too

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
  for (const el of document.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
}

function announce(text) { $("live").textContent = text; }

function showError(err) {
  const beside = err.field && document.querySelector('.err[data-for="' + CSS.escape(err.field) + '"]');
  (beside || $("general-error")).textContent = err.error;
  const input = err.field && form.elements[err.field];
  if (input && input.setAttribute) input.setAttribute("aria-invalid", "true");
  announce("error: " + err.error);
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

function stale(why) {
  $("bar").classList.add("stale");
  $("answer").classList.add("stale");
  $("fixes").replaceChildren();
  $("status").textContent = why;
}

function list(parent, title, items) {
  if (!items.length) return;
  const h = document.createElement("h2"); h.textContent = title;
  const ul = document.createElement("ul");
  for (const text of items) { const li = document.createElement("li"); li.textContent = text; ul.append(li); }
  parent.append(h, ul);
}

function showDefaults(defaults) {
  for (const el of form.elements) {
    if (!el.name || el.type === "file") continue;
    const known = el.name in defaults && defaults[el.name] !== null;
    const text = known ? String(defaults[el.name]) : "";
    if (el.tagName === "SELECT" && el.options[0] && el.options[0].value === "" && el.name !== "profile")
      el.options[0].textContent = known ? "(profile default: " + text + ")" : "(profile default)";
    else if (el.tagName === "INPUT" && el.name in defaults)
      el.placeholder = known ? text + " (profile default)" : "(profile default)";
  }
}

function showAnswer(doc) {
  const bar = $("verdict-bar");
  bar.className = "verdict " + doc.verdict;
  const cut = doc.headline.indexOf(":");
  $("verdict-word").textContent = doc.headline.slice(0, cut + 1);
  $("headline").textContent = doc.headline.slice(cut + 1).trim();
  $("bar").classList.remove("stale");
  $("answer").classList.remove("stale");
  const fixes = $("fixes");
  fixes.replaceChildren();
  for (const step of doc.next_steps) {
    const b = document.createElement("button");
    b.type = "button"; b.className = "fix"; b.dataset.fields = JSON.stringify(step.fields);
    b.textContent = step.label + ": " + step.effect;
    fixes.append(b);
  }
  const warnings = $("warnings");
  warnings.replaceChildren();
  for (const w of doc.warnings) { const li = document.createElement("li"); li.textContent = "warning: " + w; warnings.append(li); }
  $("summary").textContent = doc.summary;
  $("next").textContent = doc.next;
  $("result").innerHTML = doc.html;   // the server's escaped charts and tables
  const lists = $("lists");
  lists.replaceChildren();
  list(lists, "assumed", doc.assumptions);
  showDefaults(doc.defaults);
  $("status").textContent = "";
  announce(doc.headline + (doc.warnings.length ? "; " + doc.warnings.length + " warning(s)" : "") +
           (doc.next_steps.length ? "; " + doc.next_steps.length + " change(s) that fit above" : ""));
}

async function update() {
  const mine = ++asked;
  clearErrors();
  const body = request();
  if (!body.model) { stale("name a model to start"); $("headline").textContent = "name a model to start";
                     announce("no model: name a model to start"); return; }
  $("status").textContent = "estimating...";
  try {
    const doc = await (await post("/api/answer", body)).json();
    if (mine !== asked) return;   // a newer change is on its way
    showAnswer(doc);
    if (planOpen) plan();
  } catch (err) {
    if (mine !== asked) return;
    stale("not estimated: see the message beside the field");
    showError(err);
  }
}

function setField(name, value) {
  const el = form.elements[name];
  if (!el || el.type === "file") return false;
  const text = value === null ? "" : Array.isArray(value) ? value.join(",") : String(value);
  if (el.tagName === "SELECT" && ![...el.options].some(o => o.value === text)) el.add(new Option(text, text));
  el.value = text;
  return true;
}

function applyFields(fields) {
  for (const [k, v] of Object.entries(fields)) {
    if (setField(k, v)) { delete fromFile[k]; continue; }
    if (v === null) delete fromFile[k]; else fromFile[k] = v;
  }
  update();
}

function planBody() {
  const body = request();
  body.allow = [...document.querySelectorAll('#plan-controls input[name="allow"]:checked')].map(b => b.value);
  const batch = $("global-batch").value.trim();
  if (batch) body.global_batch = /^[0-9]+$/.test(batch) ? Number(batch) : batch;
  return body;
}

async function plan() {
  const mine = asked;
  const view = $("plan");
  view.classList.add("stale");
  $("plan-heading").textContent = "planning...";
  try {
    const doc = await (await post("/api/plan_view", planBody())).json();
    if (mine !== asked) return;
    $("plan-heading").textContent = doc.heading;
    view.innerHTML = doc.html;   // the server's escaped table
    view.classList.remove("stale");
    announce(doc.heading);
  } catch (err) { if (mine === asked) { view.replaceChildren(); $("plan-heading").textContent = ""; showError(err); } }
}

function download(name, text, type) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(new Blob([text], {type: type}));
  a.download = name;
  document.body.appendChild(a); a.click(); a.remove();
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
    $("imported").textContent = doc.name + " (" + doc.format + ")" + (extra ? "; also from the file: " + extra : "");
    await update();
  } catch (err) { showError({error: err.error || String(err), field: "framework_file"}); }
}

form.addEventListener("change", e => { if (e.target.type !== "file") update(); });
form.addEventListener("submit", e => { e.preventDefault(); update(); });
form.elements.model.addEventListener("input", () => {
  uploadedModel = null;
  if (!form.elements.model.value.trim()) update();   // cleared: the old verdict greys out at once
});
$("model-file").addEventListener("change", async e => {
  const file = e.target.files[0];
  if (!file) return;
  try {
    uploadedModel = {name: file.name, config: JSON.parse(await file.text())};
    form.elements.model.value = "";
    update();
  } catch (err) { showError({error: file.name + ": not JSON: " + err.message, field: "model"}); }
});
$("framework-file").addEventListener("change", e => { if (e.target.files[0]) importFile(e.target.files[0]); });
$("clear-file").addEventListener("click", () => { fromFile = {}; $("imported").textContent = ""; update(); });
$("fixes").addEventListener("click", e => {
  const b = e.target.closest("button.fix");
  if (b) applyFields(JSON.parse(b.dataset.fields));
});
$("plan").addEventListener("click", e => {
  const b = e.target.closest("button.apply-row");
  if (b) applyFields(JSON.parse(b.dataset.fields));
});
$("export").addEventListener("click", async () => {
  clearErrors();
  const format = $("format").value;
  try {
    const doc = await (await post("/api/export", Object.assign(request(), {format: format}))).json();
    $("export-note").textContent = "written for " + doc.model + " under the " + doc.profile + " profile";
    $("export-text").textContent = doc.files.map(f => "# " + f.name + "\\n" + f.text).join("\\n");
    for (const f of doc.files) download(f.name, f.text, "text/plain");
    announce("exported " + doc.files.map(f => f.name).join(", "));
  } catch (err) { showError(err); }
});
$("plan-button").addEventListener("click", () => { planOpen = true; clearErrors(); plan(); });
$("plan-controls").addEventListener("change", () => { if (planOpen) plan(); });
$("report").addEventListener("click", async () => {
  clearErrors();
  try {
    download("memfit-report.html", await (await post("/api/report.html", request())).text(), "text/html");
  } catch (err) { showError(err); }
});
update();
</script>"""
