"""DeepSpeed config JSON (`ds_config.json`): ZeRO stage, offload, buckets, batch sizes, precision.

"auto" values are left out of the knobs, so `build_scenario` fills them by the profile's rule
(docs/knobs.md A.3): HF Trainer / accelerate fill the buckets from the hidden size; plain DeepSpeed and
OpenRLHF drop "auto" to DeepSpeed's own defaults. A file read alone is taken as HF-driven (the only
reader that accepts "auto" batch sizes); pass `profile=` to say otherwise.
"""
from __future__ import annotations

import difflib

from memfit.facts.engines import deepspeed as deepspeed_facts
from memfit.facts.knobs import knobs, said_by
from memfit.interfaces.formats import jsontext
from memfit.interfaces.formats.base import (ImportedConfig, as_bool, as_choice, as_float, as_int, bad, cannot, changed_knobs,
                                 doc_copy, is_auto, read_text, shown, unknown_key, verify_written)
from memfit.interfaces.formats.tables import check_type, table

FORMAT = "deepspeed"
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

# memfit knob -> key inside zero_optimization (DeepSpeed accepts the alias or the field name)
ZERO_KEYS = {
    "reduce_bucket_size": ("reduce_bucket_size",),
    "overlap_comm": ("overlap_comm",),
    "contiguous_gradients": ("contiguous_gradients",),
    "prefetch_bucket_size": ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
    "param_persistence_threshold": ("stage3_param_persistence_threshold", "param_persistence_threshold"),
    "max_live_parameters": ("stage3_max_live_parameters", "max_live_parameters"),
    "sub_group_size": ("sub_group_size",),
}
BOOL_KNOBS = ("overlap_comm", "contiguous_gradients")
GRAD_ACCUM_DTYPES = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "float32": "fp32", "bfloat16": "bf16",
                     "float16": "fp16"}
# Engine knobs this file carries (the knob table's `says`), which the formats that point at a DeepSpeed file
# route here; the training arguments say the batch and the precision themselves.
TRAINER_KNOBS = ("precision", "micro_batch", "grad_accum")
KNOBS = tuple(k for k in knobs() if k in said_by(FORMAT) and k not in TRAINER_KNOBS)
WELL_KNOWN_TOP = ("zero_optimization", "train_batch_size", "train_micro_batch_size_per_gpu",
                  "gradient_accumulation_steps", "gradient_clipping", "bf16", "fp16", "optimizer", "scheduler",
                  "data_types", "zero_allow_untested_optimizer", "activation_checkpointing", "steps_per_print")


def _check_section(doc: dict, name: str, where: str, prefix: str) -> None:
    known = table("deepspeed")[name]
    for key, value in doc.items():
        if key not in known:
            raise unknown_key(where, f"{prefix}{key}", known, "DeepSpeed")
        if not is_auto(value) and known[key].get("type") != "dict":
            check_type(where, f"{prefix}{key}", value, known[key])


def _zero(doc: dict, where: str) -> dict:
    zero = doc.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise bad(where, "zero_optimization", f"expected a mapping, got {shown(zero)}")
    _check_section(zero, "zero_optimization", where, "zero_optimization.")
    for section in ("offload_optimizer", "offload_param"):
        sub = zero.get(section)
        if sub is not None and not isinstance(sub, dict):
            raise bad(where, f"zero_optimization.{section}", f"expected a mapping, got {shown(sub)}")
        if sub:
            _check_section(sub, section, where, f"zero_optimization.{section}.")
    return zero


def _find(zero: dict, names: tuple[str, ...]):
    for name in names:
        if name in zero:
            return name, zero[name]
    return None, None


def engine_knobs(doc: dict, where: str) -> dict:
    """The ZeRO / offload / precision knobs a DeepSpeed document states ("auto" = not stated)."""
    if not isinstance(doc, dict):
        raise bad(where, None, "a DeepSpeed config is a JSON object")
    zero = _zero(doc, where)
    knobs: dict = {"engine": "deepspeed"}
    knobs["zero_stage"] = 0 if "stage" not in zero else as_int(where, "zero_optimization.stage", zero["stage"])
    if knobs["zero_stage"] not in (0, 1, 2, 3):
        raise bad(where, "zero_optimization.stage", f"ZeRO stage {shown(zero['stage'])} does not exist; use 0, 1, 2 or 3")
    opt, par = zero.get("offload_optimizer") or {}, zero.get("offload_param") or {}
    knobs["offload_optimizer"] = as_choice(where, "zero_optimization.offload_optimizer.device",
                                           opt.get("device", "none"), OFFLOAD_DEVICES)
    knobs["offload_param"] = as_choice(where, "zero_optimization.offload_param.device", par.get("device", "none"),
                                       OFFLOAD_DEVICES)
    pins = [(name, sub) for name, sub in (("offload_optimizer", opt), ("offload_param", par)) if "pin_memory" in sub]
    pins.sort(key=lambda p: knobs[p[0]] == "none")  # an active offload's setting is the one that matters
    if pins:
        name, sub = pins[0]
        knobs["pin_memory"] = as_bool(where, f"zero_optimization.{name}.pin_memory", sub["pin_memory"])
    if "ratio" in opt:
        knobs["ratio"] = as_float(where, "zero_optimization.offload_optimizer.ratio", opt["ratio"])
    for knob, names in ZERO_KEYS.items():
        key, value = _find(zero, names)
        if key is None or is_auto(value):
            continue
        convert = as_bool if knob in BOOL_KNOBS else as_int
        knobs[knob] = convert(where, f"zero_optimization.{key}", value)
    dtype = (doc.get("data_types") or {}).get("grad_accum_dtype")
    if dtype is not None:
        knobs["grad_accum_dtype"] = GRAD_ACCUM_DTYPES.get(dtype) or as_choice(
            where, "data_types.grad_accum_dtype", dtype, tuple(GRAD_ACCUM_DTYPES))
    for section, precision in (("bf16", "bf16-mixed"), ("fp16", "fp16-mixed")):
        enabled = (doc.get(section) or {}).get("enabled") if isinstance(doc.get(section), dict) else None
        if enabled is not None and not is_auto(enabled) and as_bool(where, f"{section}.enabled", enabled):
            if "precision" in knobs:
                raise bad(where, section, "bf16 and fp16 are both enabled; DeepSpeed allows one")
            knobs["precision"] = precision
    return knobs


def batch_sizes(doc: dict, where: str) -> dict:
    """Numeric batch keys (train_batch_size, micro, accumulation); "auto" and absent keys are left out."""
    out = {}
    for key in BATCH_KEYS:
        value = doc.get(key)
        if value is not None and not is_auto(value):
            out[key] = as_int(where, key, value, minimum=1)
    return out


def resolve_batch(sizes: dict, where: str, gpus: int | None) -> tuple[dict, dict]:
    """Knobs and world hints from DeepSpeed's batch triangle: train = micro x accumulation x world."""
    tb = sizes.get("train_batch_size")
    micro = sizes.get("train_micro_batch_size_per_gpu")
    accum = sizes.get("gradient_accumulation_steps")
    knobs: dict[str, int] = {}
    world: dict[str, int] = {}
    if micro is not None:
        knobs["micro_batch"] = micro
    if accum is not None:
        knobs["grad_accum"] = accum
    if tb is None:
        return knobs, world
    world["global_batch"] = tb
    if micro is not None and accum is not None:
        if tb % (micro * accum):
            raise bad(where, "train_batch_size", f"{tb} is not train_micro_batch_size_per_gpu {micro} x "
                      f"gradient_accumulation_steps {accum} x a whole number of GPUs")
        implied = tb // (micro * accum)
        if gpus is not None and implied != gpus:
            raise bad(where, "train_batch_size", f"{tb} != train_micro_batch_size_per_gpu {micro} x "
                      f"gradient_accumulation_steps {accum} x {gpus} GPUs (DeepSpeed refuses this)")
        world["num_gpus"] = implied
    elif gpus is not None:
        known = micro if micro is not None else accum
        name = "train_micro_batch_size_per_gpu" if micro is not None else "gradient_accumulation_steps"
        if known is not None:
            if tb % (known * gpus):
                raise bad(where, "train_batch_size", f"{tb} is not {name} {known} x {gpus} GPUs x a whole number")
            knobs["grad_accum" if micro is not None else "micro_batch"] = tb // (known * gpus)
        elif tb % gpus:
            raise bad(where, "train_batch_size", f"{tb} is not divisible by {gpus} GPUs")
        else:
            knobs["micro_batch"] = tb // gpus
        world["num_gpus"] = gpus
    return knobs, world


def _warn_top(doc: dict, where: str) -> list[str]:
    warnings = []
    for key in doc:
        if key in WELL_KNOWN_TOP:
            continue
        close = difflib.get_close_matches(key, WELL_KNOWN_TOP, n=1, cutoff=0.8)
        if close:
            warnings.append(f"{where}: {key}: DeepSpeed ignores unknown top-level keys; did you mean {close[0]!r}?")
    return warnings


def read(path_or_text, *, profile: str = "hf-trainer", gpus: int | None = None) -> ImportedConfig:
    text, path = read_text(path_or_text, "DeepSpeed config")
    where = str(path) if path else "DeepSpeed config"
    doc = jsontext.load(text, where)
    return from_doc(doc, text, path, where, profile=profile, gpus=gpus)


def from_doc(doc, text, path, where, *, profile="hf-trainer", gpus=None) -> ImportedConfig:
    knobs = engine_knobs(doc, where)
    batch_knobs, world = resolve_batch(batch_sizes(doc, where), where, gpus)
    knobs.update(batch_knobs)
    if gpus is not None:
        world.setdefault("num_gpus", gpus)
    return ImportedConfig(format=FORMAT, profile=profile, knobs=knobs, text=text, doc=doc, path=path, world=world,
                          warnings=_warn_top(doc, where))


# --- writing -------------------------------------------------------------------------------------------

def _set_zero(zero: dict, names: tuple[str, ...], value) -> None:
    key, _ = _find(zero, names)
    if value is None:
        zero.pop(key, None)
    else:
        zero[key or names[0]] = value


def _put(section: dict | None, key: str, value) -> dict:
    """A copy of a config section with `key` set, or removed when `value` is None (back to the default)."""
    out = dict(section or {})
    if value is None:
        out.pop(key, None)
    else:
        out[key] = value
    return out


def apply_engine(doc: dict, changes: dict, imported: ImportedConfig) -> dict:
    """A copy of `doc` with the engine knobs in `changes` written in (None = remove the key)."""
    doc = doc_copy(doc)
    zero = doc.setdefault("zero_optimization", {})
    if "zero_stage" in changes:
        _set_zero(zero, ("stage",), changes["zero_stage"])
    for knob in ("offload_optimizer", "offload_param"):
        if knob not in changes:
            continue
        offload = dict(zero.get(knob) or {})
        if changes[knob] is None:
            offload.pop("device", None)
        else:
            offload["device"] = changes[knob]
        if offload or knob in zero:
            zero[knob] = offload
    if "pin_memory" in changes:
        sections = [s for s in ("offload_optimizer", "offload_param") if isinstance(zero.get(s), dict)]
        active = [s for s in sections if zero[s].get("device", "none") != "none"]
        for section in active or sections or ["offload_optimizer"]:
            zero[section] = _put(zero.get(section), "pin_memory", changes["pin_memory"])
    if "ratio" in changes:
        zero["offload_optimizer"] = _put(zero.get("offload_optimizer"), "ratio", changes["ratio"])
    for knob, names in ZERO_KEYS.items():
        if knob in changes:
            _set_zero(zero, names, changes[knob])
    if "grad_accum_dtype" in changes:
        doc["data_types"] = _put(doc.get("data_types"), "grad_accum_dtype", changes["grad_accum_dtype"])
    original = imported.doc.get("zero_optimization") or {}
    for section in ("offload_optimizer", "offload_param"):  # drop what we added and emptied again
        if zero.get(section) == {} and section not in original:
            zero.pop(section)
    if doc.get("data_types") == {} and "data_types" not in imported.doc:
        doc.pop("data_types")
    if not zero and "zero_optimization" not in imported.doc:
        doc.pop("zero_optimization")
    return doc


def apply_precision(doc: dict, precision, imported: ImportedConfig) -> dict:
    doc = doc_copy(doc)
    wanted = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(precision)
    if precision is not None and wanted is None:
        raise cannot(imported, "precision", precision, "DeepSpeed JSON says bf16 or fp16 mixed precision only")
    for section in ("bf16", "fp16"):
        current = doc.get(section)
        if section == wanted:
            doc[section] = dict(current or {}, enabled=True)
        elif isinstance(current, dict) and current.get("enabled") not in (False, None):
            doc[section] = dict(current, enabled=False)
    return doc


def apply_batch(doc: dict, changes: dict, imported: ImportedConfig) -> dict:
    """Micro-batch / accumulation into the batch triangle, keeping train_batch_size consistent."""
    doc = doc_copy(doc)
    for knob, key in (("micro_batch", "train_micro_batch_size_per_gpu"), ("grad_accum", "gradient_accumulation_steps")):
        if knob not in changes:
            continue
        if is_auto(doc.get(key)):
            raise cannot(imported, knob, changes[knob], f'{key} is "auto": the training arguments set it')
        if changes[knob] is None:
            doc.pop(key, None)
        else:
            doc[key] = changes[knob]
    tb = doc.get("train_batch_size")
    if tb is not None and not is_auto(tb) and ("micro_batch" in changes or "grad_accum" in changes):
        gpus = imported.world.get("num_gpus")
        micro = changes.get("micro_batch", imported.knobs.get("micro_batch"))
        accum = changes.get("grad_accum", imported.knobs.get("grad_accum"))
        if "grad_accum" not in changes and "gradient_accumulation_steps" not in doc:
            pass  # DeepSpeed derives the accumulation from train_batch_size: the global batch stays
        elif gpus is None or micro is None or accum is None:
            raise cannot(imported, "micro_batch/grad_accum", (micro, accum),
                         "train_batch_size needs the number of GPUs; say --gpus")
        else:
            doc["train_batch_size"] = micro * accum * gpus
    return doc


def write(imported: ImportedConfig, knobs: dict) -> str:
    """The same JSON with only the changed knobs' keys edited (numbers such as 5e8 kept as written)."""
    changes = changed_knobs(imported, knobs)
    doc = new_doc(imported, changes)
    text = jsontext.edit(imported.text, imported.doc, doc, imported.name)
    again = from_doc(jsontext.load(text, imported.name), text, imported.path, imported.name,
                     profile=imported.profile, gpus=imported.world.get("num_gpus"))
    verify_written(imported, again, changes)
    return text


def new_doc(imported: ImportedConfig, changes: dict) -> dict:
    unknown = set(changes) - set(KNOBS) - {"precision", "micro_batch", "grad_accum", "engine"}
    if unknown:
        knob = sorted(unknown)[0]
        raise cannot(imported, knob, changes[knob], "a DeepSpeed config does not carry it; the training "
                     "arguments or the launcher do")
    if changes.get("engine", "deepspeed") not in ("deepspeed", None):
        raise cannot(imported, "engine", changes["engine"], "a DeepSpeed config is the DeepSpeed engine")
    doc = apply_engine(imported.doc, {k: v for k, v in changes.items() if k in KNOBS}, imported)
    if "precision" in changes:
        doc = apply_precision(doc, changes["precision"], imported)
    return apply_batch(doc, changes, imported)


# --- a fresh file --------------------------------------------------------------------------------------

def fresh_doc(knobs: dict, *, hf_auto: bool = True) -> dict:
    """A new DeepSpeed config for these knobs. `hf_auto`: batch sizes and precision "auto", for HF
    Trainer / accelerate / LLaMA-Factory to fill (the LLaMA-Factory example files' shape)."""
    if hf_auto:
        doc = {key: "auto" for key in BATCH_KEYS} | {"gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
                                                      "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
    else:
        doc = {"train_micro_batch_size_per_gpu": knobs.get("micro_batch", 1),
               "gradient_accumulation_steps": knobs.get("grad_accum", 1)}
        precision = knobs.get("precision", "bf16-mixed")
        doc["bf16"] = {"enabled": precision == "bf16-mixed"}
        if precision == "fp16-mixed":
            doc["fp16"] = {"enabled": True}
    stage = knobs.get("zero_stage", 0)
    doc["zero_optimization"] = {"stage": stage}
    placeholder = ImportedConfig(format=FORMAT, profile="hf-trainer", knobs={"zero_stage": stage}, text="{}", doc=doc)
    engine = {k: v for k, v in knobs.items() if k in KNOBS and k != "zero_stage" and v is not None}
    return apply_engine(doc, engine, placeholder)


def export(knobs: dict, *, hf_auto: bool = True) -> str:
    """A new file stating only these knobs (what a rewrite adds when the run had no DeepSpeed file)."""
    import json

    return json.dumps(fresh_doc(knobs, hf_auto=hf_auto), indent=2) + "\n"


def export_config(scenario, *, hf_auto: bool = True) -> str:
    """The DeepSpeed JSON of a scenario (memfit/facts/engines/deepspeed.py, the writer the real-engine
    measurement uses); `hf_auto`: batch sizes, clipping and precision "auto", for HF Trainer / accelerate /
    LLaMA-Factory to fill (the LLaMA-Factory example files' shape)."""
    import json

    doc = deepspeed_facts.config(scenario)
    if hf_auto:
        doc = {**{key: "auto" for key in BATCH_KEYS}, "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
               "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}, "zero_optimization": doc["zero_optimization"]}
    return json.dumps(doc, indent=2) + "\n"
