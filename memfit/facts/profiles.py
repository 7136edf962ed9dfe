"""A Scenario from what the user said: the knobs a user left unset get what their framework really does.

The framework's facts live in data/frameworks/NAME.toml (memfit/facts/frameworks.py); this module applies them
and records each default it took, so the output can say which assumptions the estimate rests on.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from memfit.errors import MemfitError
from memfit.facts.assumptions import Assumption, from_source
from memfit.facts.adapters import adapter_methods, method_info, wraps
from memfit.facts.catalog import ModelSpec
from memfit.facts.engines import ENGINES
from memfit.facts.engines.deepspeed import hf_auto_buckets
from memfit.facts.frameworks import Framework, framework
from memfit.facts.knobs import acting_when, inert_because, knobs
from memfit.facts.loss_tail import notes as loss_notes
from memfit.facts.runtime import default_runtime
from memfit.facts.methods import several_models
from memfit.facts.remote_code import ignored_checkpointing
from memfit.facts.scenario import Hardware, Scenario
from memfit.facts.versions import pinned


def zero_buckets(fw: Framework, model: ModelSpec, stage: int) -> dict:
    """DeepSpeed values for keys a framework writes as "auto" (docs/knobs.md A.3)."""
    return hf_auto_buckets(model.hidden_size, stage) if fw.deepspeed_auto == "hf" else {}


def _engine(given: dict, defaults: dict, hardware: Hardware, name: str) -> tuple[str, dict, list[Assumption]]:
    """The engine, the given knobs with the ZeRO stage a profile's DeepSpeed default sets, and what was assumed."""
    _check_one_engine(given)
    if given.get("engine"):
        return given["engine"], given, []
    if given.get("zero_stage") is not None:
        return "deepspeed", given, []
    if given.get("fsdp_strategy"):
        return "fsdp", given, []
    if "zero_stage" in defaults:
        stage = defaults["zero_stage"]
        note = Assumption(f"engine=deepspeed ZeRO-{stage} ({name} default)", "profile", "engine", "deepspeed")
        return "deepspeed", given | {"zero_stage": stage}, [note]
    if hardware.world_size > 1:
        return "ddp", given, [Assumption("engine=ddp (several GPUs, no ZeRO/FSDP given)", "memfit", "engine", "ddp")]
    return "single", given, []


def _check_one_engine(given: dict) -> None:
    """A ZeRO stage means DeepSpeed and a sharding strategy means FSDP: saying both, or another engine, is a
    contradiction the user must settle (not one for memfit to pick)."""
    implied = {e for e, knob in (("deepspeed", "zero_stage"), ("fsdp", "fsdp_strategy")) if given.get(knob) is not None}
    if given.get("engine"):
        implied.add(given["engine"])
    if len(implied) > 1:
        flags = [knobs()[k].label for k in ("engine", "zero_stage", "fsdp_strategy") if given.get(k) is not None]
        raise MemfitError(f"{' and '.join(flags)} name different engines ({', '.join(sorted(implied))}); say one")


def _unknown(given: dict) -> None:
    unknown = sorted(set(given) - set(knobs()))
    if unknown:
        raise MemfitError(f"unknown knob {unknown[0]!r}; the knobs are listed by `memfit estimate --help`")


def _engine_values(engine: str, given: dict, fw: Framework, model: ModelSpec) -> dict:
    """The knobs of the engine in use (another engine's knobs the user gave do nothing: `_inert` says so)."""
    values: dict = {}
    if engine == "deepspeed":
        stage = given.get("zero_stage", 0)
        values = {"zero_stage": stage, **zero_buckets(fw, model, stage)}
        values |= {k: given[k] for k in acting_when("deepspeed") if k in given}
    elif engine == "fsdp":
        values = {"fsdp_strategy": given.get("fsdp_strategy", "full_shard")}
        values |= {k: given[k] for k in acting_when("fsdp") if k in given and k != "fsdp_strategy"}
    return values


def _releases(profile: str, versions: dict, tuning: str) -> tuple[tuple, dict, list[Assumption]]:
    """The framework releases the user named (data/releases.toml): (package, version) pairs for the Scenario, the
    knob defaults they set for this tuning ({knob: (value, "transformers 4.44")}) and what was assumed about them."""
    if not versions:
        return (), {}, []
    from memfit.facts.releases import check_versions, completed, release_facts

    named, notes = completed(check_versions(versions))
    pairs = tuple(sorted(named.items()))
    facts = release_facts(profile, pairs, tuning)
    said = ", ".join(f"{n} {v}" for n, v in pairs)
    return pairs, facts.defaults, from_source([f"framework releases {said}: their facts (data/releases.toml) replace "
                                               "the pinned releases'", *notes, *facts.notes], "release")


def _shown(value) -> str:
    """A default as a user would type it: lists comma-separated (lora_targets=q,v)."""
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _default(name: str, value, origin: str, by_release: dict) -> Assumption:
    """A knob a profile's (or a release's) default filled: "lora_targets=q,v (llamafactory default)"."""
    return Assumption(f"{name}={_shown(value)} ({origin} default)", "release" if name in by_release else "profile",
                      name, value)


def build_scenario(model: ModelSpec, hardware: Hardware, knobs_given: Mapping, profile_name: str = "hf-trainer",
                   typed: Collection[str] = (), versions: Mapping | None = None) -> Scenario:
    """`knobs_given` holds what the user said (None or absent = not said); the profile fills the rest. `typed` names
    the knobs the user typed on the command line: one of them that does nothing on this run (its `when` / `needs`
    in the knob table) is an error; any other given knob that does nothing (an inert key of a framework file) is
    listed under "assumed" as ignored. Nothing given is changed: the Scenario holds new values, and each default
    taken is an Assumption record (memfit/facts/assumptions.py)."""
    given = {k: v for k, v in knobs_given.items() if v is not None}
    _unknown(given)
    for name, value in given.items():  # before the method and engine are looked up by name below
        knobs()[name].check(value)
    fw = framework(profile_name)
    releases, by_release, assumed = _releases(profile_name, dict(versions or {}),
                                              given.get("tuning", knobs()["tuning"].default))
    values, taken = _profile_values(fw, profile_name, given, hardware, by_release)
    assumed += taken
    several = [n for n in acting_when("several") if n in given]
    if not several_models(values.get("method", "sft")) and several:
        raise MemfitError(f"{', '.join(sorted(several))} only apply to preference / RL methods; add --method")
    values = _as_tuples(values)
    values, assumed = _attention_kernel(values, model, "attention" in typed, "attention" in given, assumed)
    model, values, given, assumed = _own_model_code(fw, model, hardware, values, given, assumed)
    assumed += _prompt_adapter(fw, model, values.get("tuning"))
    if values.get("tuning") == "qlora" and values.get("quant_bits") == 8:
        assumed.append(Assumption("8-bit base: each Linear keeps 1% of its input columns as LLM.int8 outliers (fp16; "
                                  "data-dependent, memory/int8_base.py)", "memfit", "quant_bits", 8))
    engine, given, notes = _engine(given, fw.defaults, hardware, profile_name)
    values, more, moved = _engine_knobs(engine, values, given, fw, model, by_release, profile_name)
    assumed += notes + more
    if values.get("tuning") in ("lora", "qlora") and "lora_rank" not in given and "lora" not in fw.model_code:
        assumed.append(Assumption("lora rank=8" + ("" if "lora_targets" in by_release else ", targets=all-linear"),
                                  "memfit", "lora_rank", knobs()["lora_rank"].default))
    if values.get("tuning") in adapter_methods():
        values, notes = _peft_defaults(values, given)
        assumed += notes
    s = Scenario(model=model, hardware=hardware, profile=profile_name, releases=releases, assumed=tuple(assumed),
                 **values)
    return _after_building(s, given, typed, moved, profile_name)


def _profile_values(fw: Framework, profile_name: str, given: dict, hardware: Hardware,
                    by_release: dict) -> tuple[dict, list[Assumption]]:
    """Every knob but the engine's: what the user gave, else the profile's (or a release's) default, and the
    defaults taken that a user may not expect (the table's `assumed`)."""
    below = fw.below_capability.get("capability", 0)
    origin = (f"{profile_name} below compute capability {below:g}"
              if hardware.gpu.compute_capability < below else profile_name)
    defaults = {name: (value, origin if fw.defaults.get(name) != value else profile_name)
                for name, value in fw.defaults_for(hardware.gpu.compute_capability).items()} | by_release
    values: dict = {}
    assumed: list[Assumption] = []
    for name, k in knobs().items():
        if k.when in ("deepspeed", "fsdp") or name == "engine":
            continue
        if name in given:
            values[name] = given[name]
        elif (k.profile or name in by_release) and name in defaults:  # a release's recipes may set more (lora_targets)
            values[name] = defaults[name][0]
            if k.assumed or name in by_release:
                assumed.append(_default(name, defaults[name][0], defaults[name][1], by_release))
    return values, assumed


def _as_tuples(values: dict) -> dict:
    """The Scenario holds tuples: a file's role_gpus mapping and lora_targets list become them."""
    out = dict(values)
    if isinstance(out.get("role_gpus"), dict):
        out["role_gpus"] = tuple(sorted(out["role_gpus"].items()))
    if isinstance(out.get("lora_targets"), list):
        out["lora_targets"] = tuple(out["lora_targets"])
    return out


def _engine_knobs(engine: str, values: dict, given: dict, fw: Framework, model: ModelSpec, by_release: dict,
                  profile_name: str) -> tuple[dict, list[Assumption], dict[str, Assumption]]:
    """The engine and its knobs: given, the framework's engine defaults (its FSDP version) unless a release says,
    a release's engine defaults (`moved`: noted only where they act), and the engine's k-bit upcast."""
    values = values | {"engine": engine} | _engine_values(engine, given, fw, model)
    assumed = []
    for name in acting_when(engine):
        if name not in values and knobs()[name].profile and name in fw.defaults and name not in by_release:
            values[name] = fw.defaults[name]
            assumed.append(_default(name, fw.defaults[name], profile_name, by_release))
    moved = {}  # an engine's defaults that moved between its releases
    for name, (value, release) in by_release.items():
        if knobs()[name].when == engine and name not in given:
            values[name] = value
            moved[name] = Assumption(f"{name}={value} ({release} default)", "release", name, value)
    upcast = ENGINES[engine].kbit_upcast_default()
    if upcast is not None and "kbit_upcast" not in given:
        values["kbit_upcast"] = upcast
    return values, assumed, moved


def _after_building(s: Scenario, given: dict, typed: Collection[str], moved: dict[str, Assumption],
                    profile_name: str) -> Scenario:
    """What only the built run can tell: release defaults that act, inert knobs, a sequence past the model's
    positions, a machine profile, the loss's facts, and a remote-code file that ignores checkpointing."""
    notes = [text for name, text in moved.items() if inert_because(s, name) is None]  # only where it acts
    notes += _inert(s, given, typed) + beyond_positions(s) + _machine(s.hardware)
    notes += from_source(loss_notes(s), "catalog")
    ignored = ignored_checkpointing(s.model.arch, profile_name) if s.checkpointing != "off" else None
    if ignored:  # a remote-code file that never turns the checkpointing the framework asks for on
        s = replace(s, checkpointing="off")
        notes.append(Assumption(ignored, "catalog", "checkpointing", "off"))
    return replace(s, assumed=s.assumed + tuple(notes)) if notes else s


def _own_model_code(fw: Framework, model: ModelSpec, hardware: Hardware, values: dict, given: dict,
                    assumed: list[Assumption]) -> tuple[ModelSpec, dict, dict, list[Assumption]]:
    """A framework with its own model code and scripts (its [model_code]): untied heads, its LoRA defaults, and
    what it does on several devices (LitGPT: FSDP with every block checkpointed). Returns the model, values, given
    knobs and assumptions anew."""
    code, values, given, assumed = fw.model_code, dict(values), dict(given), list(assumed)
    if code.get("ties_embeddings") is False and model.tie_embeddings:
        model = replace(model, tie_embeddings=False)
        assumed.append(Assumption(f"{fw.name} keeps the output head apart from the embedding (its own model code)",
                                  "profile"))
    lora = code.get("lora", {})
    if values.get("tuning") in ("lora", "qlora") and lora:  # qlora: lora.py with --quantize bnb.nf4
        for knob, key in (("lora_rank", "rank"), ("lora_targets", "targets"), ("lora_dropout", "dropout")):
            if knob not in given:
                values[knob] = tuple(lora[key]) if key == "targets" else lora[key]
                assumed.append(_default(knob, values[knob], fw.name, {}))
    several = code.get("several_devices", {})
    engine_said = any(given.get(k) is not None for k in ("engine", "zero_stage", "fsdp_strategy"))
    if hardware.world_size > 1 and several and not engine_said:
        given["engine"] = several["engine"]
        assumed.append(Assumption(f"engine={several['engine']} ({fw.name} on several devices)", "profile",
                                  "engine", several["engine"]))
        for knob in ("checkpointing", "reentrant"):
            if knob in several and knob not in given:  # torchtune keeps its one-device checkpointing key
                values[knob] = several[knob]
                assumed = [a for a in assumed if a.knob != knob]  # the one-device default it replaces
                assumed.append(Assumption(f"{knob}={several[knob]} ({fw.name} on several devices)", "profile",
                                          knob, several[knob]))
    return model, values, given, assumed


def _prompt_adapter(fw: Framework, model: ModelSpec, tuning: str | None) -> list[Assumption]:
    """LLaMA-Adapter runs in a framework's own model code (LitGPT's), whose [model_code.<method>] says its shape."""
    if tuning is None or wraps(tuning) != "prompt_attention":
        return []
    code = fw.model_code.get(tuning)
    if not code:
        raise MemfitError(f"--tuning {tuning} runs LitGPT's own model code: add --profile litgpt")
    if not code["scaled_linears"] and model.num_layers <= code["start_layer"]:
        raise MemfitError(f"--tuning {tuning}: {model.id} has {model.num_layers} layers, none at or above the "
                          f"prompt's start layer {code['start_layer']}, so nothing trains (LitGPT fails the same way)")
    return [Assumption(f"{tuning}: a {code['prompt_length']}-token prompt in every layer from layer "
                       f"{code['start_layer']} ({fw.name} default)"
                       + ("" if code["prompt_trains"] else "; the prompt itself gets no gradient, only its gates "
                                                           "(traced)"), "profile", "tuning", tuning)]


def _inert(s: Scenario, given: dict, typed: Collection[str]) -> list[Assumption]:
    """A knob set on a run where it does nothing is never dropped silently: typed -> an error, from a file -> a note.
    A file's inert key at the knob's default (OpenRLHF always writes pin_memory) says nothing worth a note."""
    notes = []
    for name, value in given.items():
        why = inert_because(s, name)
        if why is None:
            continue
        k = knobs()[name]
        if name in typed:
            raise MemfitError(f"{k.label} has no effect here: {why}; leave it out")
        if value != k.default:
            shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
            notes.append(Assumption(f"ignored {k.flag}={shown}: {why}", "config", name, value))
    return notes


# What a sequence past the model's positions means in the real code, per kind of position encoding.
BEYOND_POSITIONS = {
    "rope": "it runs only with RoPE scaling (rope_scaling) or a longer-context checkpoint",
    "alibi": "ALiBi runs it, but the model never trained on such lengths",
    "learned": "the learned position table has no row for it: the real run fails",
}


def _attention_kernel(values: dict, model: ModelSpec, typed: bool, given: bool,
                      assumed: list[Assumption]) -> tuple[dict, list[Assumption]]:
    """A kernel transformers has no path for in this family (ModelSpec.has_sdpa / has_flash): typed, an error;
    from a profile's default, eager (transformers' own fallback); from a file, eager and a warning that
    transformers refuses the file's choice at load. Returns the values and assumptions anew."""
    kernel = values.get("attention")
    if kernel is None or {"sdpa": model.has_sdpa, "flash": model.has_flash}.get(kernel, True):
        return values, assumed
    valid = ", ".join(k for k, ok in (("eager", True), ("sdpa", model.has_sdpa), ("flash", model.has_flash)) if ok)
    why = f"transformers {pinned()['transformers']} has no {kernel} attention for {model.arch} models"
    if typed:
        raise MemfitError(f"--attention {kernel}: {why}; valid: {valid}")
    kept = [a for a in assumed if a.knob != "attention"]  # the default it replaces
    note = Assumption(f"attention eager: {why}" + ("; the file's choice is refused when the model loads" if given
                                                   else " (it falls back to eager)"), "catalog", "attention", "eager")
    return values | {"attention": "eager"}, [*kept, note]


def beyond_positions(s: Scenario) -> list[Assumption]:
    """A warning, not an error: RoPE-scaled runs past the trained length exist. 0 positions = unknown, no warning."""
    limit, tokens = s.model.max_position_embeddings, s.seq_len + s.virtual_tokens_in_use
    if not limit or tokens <= limit:
        return []
    return [Assumption(f"sequence of {tokens:,} tokens is beyond the model's max_position_embeddings ({limit:,}): "
                       f"{BEYOND_POSITIONS.get(s.model.position, BEYOND_POSITIONS['rope'])}; memory is estimated as "
                       "given", "catalog", "seq_len", s.seq_len)]


def _machine(hardware: Hardware) -> list[Assumption]:
    """A machine profile's constants change every estimate on that machine: say which and where from."""
    rt = hardware.runtime
    if rt == default_runtime():
        return []
    return [Assumption(f"runtime constants from {rt.source}: CUDA context {rt.cuda_context / 2**30:.2f} GiB, NCCL "
                       f"{rt.nccl_one_node / 2**30:.2f} GiB (one node) / {rt.nccl_multi_node / 2**30:.2f} GiB "
                       f"(several), allocator slack {rt.fragmentation_of_churn:.0%} of the bytes freed within a step, "
                       f"host baseline {rt.process_host_baseline / 2**30:.2f} GiB per process", "config")]


def _peft_defaults(values: dict, given: dict) -> tuple[dict, list[Assumption]]:
    """A PEFT method without targets adapts what PEFT itself picks for it (data/adapters.toml)."""
    method, values, notes = values["tuning"], dict(values), []
    if "lora_targets" not in given and "default_targets" in method_info(method):
        values["lora_targets"] = tuple(method_info(method)["default_targets"])
        notes.append(Assumption(f"{method} targets={','.join(values['lora_targets'])} (PEFT's default)", "method",
                                "lora_targets", values["lora_targets"]))
    if "lora_rank" not in given and method in ("vera", "adalora", "loha", "lokr"):
        notes.append(Assumption(f"{method} rank={values.get('lora_rank', 8)}", "memfit", "lora_rank",
                                values.get("lora_rank", 8)))
    if method == "oft":  # facts/peft_shapes.py OFT_BLOCK_SIZE
        notes.append(Assumption("oft: rotation blocks of 32 of each adapted input (PEFT's default oft_block_size; "
                                "the rank knob does not apply)", "method", "tuning", method))
    if method == "boft":  # facts/peft_shapes.py BOFT_BLOCK_SIZE; the CUDA extension is not modelled
        notes.append(Assumption("boft: rotation blocks of 4, one butterfly factor (PEFT's defaults; the rank knob "
                                "does not apply); PEFT's fbd_cuda extension, where it builds, makes the same I x I "
                                "rotation", "method", "tuning", method))
    if "virtual_tokens" not in given and wraps(method) == "virtual_tokens":
        notes.append(Assumption(f"{method}: {values.get('virtual_tokens', 20)} virtual tokens (PEFT has no default)",
                                "memfit", "virtual_tokens", values.get("virtual_tokens", 20)))
    return values, notes
