"""accelerate config YAML (`accelerate launch --config_file x.yaml`): engine, ZeRO / FSDP, world size.

It carries the engine and the GPU count, not the batch or sequence (those are the training
script's). Top-level keys are accelerate's `ClusterConfig` fields (an unknown one is an error, as in
`ClusterConfig.from_yaml_file`); `deepspeed_config` / `fsdp_config` keys are copied onto `accelerate
launch` arguments, so a key that is none of them is silently ignored by accelerate and an error here.
With `deepspeed_config_file`, the ZeRO settings come from that JSON (docs/knobs.md F.5).
"""
from __future__ import annotations

from pathlib import Path

from memfit.interfaces.formats import deepspeed as ds
from memfit.interfaces.formats import jsontext, yamltext
from memfit.interfaces.formats.base import (ImportedConfig, WrittenFile, as_bool, as_choice, as_int, as_mapping, bad,
                                            companion_target,
                                            cannot, changed_knobs, doc_copy, named, read_text, shown, suggest,
                                            unknown_key, verify_written)
from memfit.interfaces.formats.tables import check_type, table

FORMAT = "accelerate"
PROFILE = "hf-trainer"
ENGINES = {"NO": "single", "MULTI_GPU": "ddp", "DEEPSPEED": "deepspeed", "FSDP": "fsdp"}
ENGINE_NAME = {v: k for k, v in ENGINES.items()}
STRATEGIES = {"FULL_SHARD": "full_shard", "SHARD_GRAD_OP": "shard_grad_op", "NO_SHARD": "no_shard",
              "HYBRID_SHARD": "hybrid_shard", "HYBRID_SHARD_ZERO2": "hybrid_shard", 1: "full_shard", 2: "shard_grad_op",
              3: "no_shard", 4: "hybrid_shard", 5: "hybrid_shard"}
STRATEGY_NAME = {"full_shard": "FULL_SHARD", "shard_grad_op": "SHARD_GRAD_OP", "no_shard": "NO_SHARD",
                 "hybrid_shard": "HYBRID_SHARD"}
# accelerate refuses these beside deepspeed_config_file (DeepSpeedPlugin._deepspeed_config_checks)
NOT_WITH_FILE = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                 "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                 "zero3_save_16bit_model")
OFFLOADS = ("none", "cpu", "nvme")
PRECISIONS = {"bf16": "bf16-mixed", "fp16": "fp16-mixed", "no": None, "fp8": None}


def _check(doc: dict, where: str) -> None:
    top = table("accelerate")["top"]
    for key, value in doc.items():
        if key not in top:
            raise unknown_key(where, key, top, "accelerate")
        if key in ("num_processes", "num_machines", "machine_rank"):  # accelerate itself checks no types
            check_type(where, key, value, top[key])
    if "distributed_type" not in doc:
        raise bad(where, "distributed_type", "missing: accelerate needs it (NO, MULTI_GPU, DEEPSPEED, FSDP, ...)")
    launch = set(table("accelerate")["deepspeed_config"])
    for key in as_mapping(where, "deepspeed_config", doc.get("deepspeed_config")):
        if key not in launch:
            raise bad(where, f"deepspeed_config.{key}", f"not an accelerate DeepSpeed setting (accelerate ignores it)"
                      f"{suggest(key, launch)}")
    fsdp_keys = set(table("accelerate")["fsdp_config"])
    for key in as_mapping(where, "fsdp_config", doc.get("fsdp_config")):
        short = str(key).removeprefix("fsdp_")  # YAML keys may be numbers
        if short not in fsdp_keys:
            raise bad(where, f"fsdp_config.{key}", "not an accelerate FSDP setting (accelerate ignores it)"
                      f"{suggest(short, fsdp_keys)}")


def _fsdp_get(fsdp: dict, name: str):
    return fsdp.get(f"fsdp_{name}", fsdp.get(name))


def _fsdp_key(fsdp: dict, name: str) -> str:
    return name if name in fsdp and f"fsdp_{name}" not in fsdp else f"fsdp_{name}"


def read(path_or_text, *, gpus: int | None = None, files: dict | None = None, path: Path | None = None) -> ImportedConfig:
    text, read_path = read_text(path_or_text, "accelerate config")
    path = read_path or path
    where = str(path) if path else "accelerate config"
    doc = yamltext.load(text, where)
    _check(doc, where)
    dist = doc["distributed_type"]
    knobs: dict = {"engine": named(where, "distributed_type", dist, ENGINES, "distributed type")}
    assumed: list[str] = []
    companions = {}
    world = {}
    if doc.get("num_processes") not in (None, -1):
        world["num_gpus"] = as_int(where, "num_processes", doc["num_processes"], minimum=1)
    if doc.get("num_machines") is not None:
        world["nodes"] = as_int(where, "num_machines", doc["num_machines"], minimum=1)
    if gpus is not None:
        world["num_gpus"] = gpus
    if doc.get("mixed_precision") not in (None, *PRECISIONS):
        raise bad(where, "mixed_precision", f"expected no, fp16, bf16 or fp8; got {shown(doc['mixed_precision'])}")
    precision = PRECISIONS.get(doc.get("mixed_precision") or "no", None)
    if precision:
        knobs["precision"] = precision
    if dist == "DEEPSPEED":
        dsc = doc.get("deepspeed_config") or {}
        if dsc.get("deepspeed_config_file"):
            clash = [k for k in NOT_WITH_FILE if k in dsc]
            if clash:
                raise bad(where, f"deepspeed_config.{clash[0]}", "accelerate refuses it beside deepspeed_config_file; "
                          "put it in the DeepSpeed JSON")
            ds_path = _resolve(dsc["deepspeed_config_file"], path, where, files)
            ds_text = (files or {}).get(ds_path) or ds_path.read_text(encoding="utf-8")
            companion = ds.from_doc(jsontext.load(ds_text, str(ds_path)), ds_text, ds_path, str(ds_path),
                                    profile=PROFILE, gpus=world.get("num_gpus"))
            companions["deepspeed"] = companion
            for key, value in companion.knobs.items():
                knobs.setdefault(key, value)
        else:
            stage = dsc.get("zero_stage")
            if stage is None:
                assumed.append("zero_stage=2 (accelerate DeepSpeedPlugin default)")
            knobs["zero_stage"] = as_int(where, "deepspeed_config.zero_stage", 2 if stage is None else stage)
            if knobs["zero_stage"] not in (0, 1, 2, 3):
                raise bad(where, "deepspeed_config.zero_stage", f"ZeRO stage {stage} does not exist")
            for knob in ("offload_optimizer", "offload_param"):
                knobs[knob] = as_choice(where, f"deepspeed_config.{knob}_device", dsc.get(f"{knob}_device", "none"),
                                        OFFLOADS)
            if dsc.get("gradient_accumulation_steps") not in (None, "auto"):
                knobs["grad_accum"] = as_int(where, "deepspeed_config.gradient_accumulation_steps",
                                             dsc["gradient_accumulation_steps"], minimum=1)
        if "zero3_init_flag" in dsc:
            knobs["zero3_init"] = as_bool(where, "deepspeed_config.zero3_init_flag", dsc["zero3_init_flag"])
    elif dist == "FSDP":
        fsdp = doc.get("fsdp_config") or {}
        version = as_int(where, "fsdp_config.fsdp_version", _fsdp_get(fsdp, "version") or 1)
        if version not in (1, 2):
            raise bad(where, "fsdp_config.fsdp_version", f"expected 1 or 2, got {shown(version)}")
        knobs["fsdp_version"] = version
        if _fsdp_get(fsdp, "version") is None:
            assumed.append("fsdp_version=1 (accelerate default)")
        strategy = _fsdp_get(fsdp, "sharding_strategy")
        reshard = _fsdp_get(fsdp, "reshard_after_forward")
        if strategy is not None:
            knobs["fsdp_strategy"] = named(where, "fsdp_config.fsdp_sharding_strategy", strategy, STRATEGIES,
                                           "sharding strategy")
        elif reshard is not None:
            if isinstance(reshard, str) and reshard in STRATEGIES:
                knobs["fsdp_strategy"] = STRATEGIES[reshard]
            else:
                on = as_bool(where, "fsdp_config.fsdp_reshard_after_forward", reshard)
                knobs["fsdp_strategy"] = "full_shard" if on else "shard_grad_op"
        else:
            knobs["fsdp_strategy"] = "full_shard"
            assumed.append("FSDP full_shard (accelerate default)")
        offload = _fsdp_get(fsdp, "offload_params")
        knobs["fsdp_cpu_offload"] = as_bool(where, "fsdp_config.fsdp_offload_params", offload) if offload is not None \
            else False
        loading = _fsdp_get(fsdp, "cpu_ram_efficient_loading")
        if loading is not None:  # rank 0 reads the checkpoint, the others build on meta (host RAM at load)
            knobs["fsdp_cpu_ram_efficient_loading"] = as_bool(where, "fsdp_config.fsdp_cpu_ram_efficient_loading",
                                                              loading)
        ckpt = _fsdp_get(fsdp, "activation_checkpointing")
        if ckpt is not None:  # absent: the training arguments decide
            on = as_bool(where, "fsdp_config.fsdp_activation_checkpointing", ckpt)
            knobs["checkpointing"] = "full" if on else "off"
        knobs_variant = f"fsdp{version}"
    variant = knobs_variant if dist == "FSDP" else None
    return ImportedConfig(format=FORMAT, profile=PROFILE, knobs=knobs, text=text, doc=doc, path=path, world=world,
                          variant=variant, assumed=assumed, companions=companions)


def _resolve(value: str, path: Path | None, where: str, files: dict | None) -> Path:
    candidate = Path(value) if Path(value).is_absolute() else (path.parent if path else Path.cwd()) / value
    for written in files or {}:
        if Path(written).resolve() == candidate.resolve():
            return written
    if candidate.is_file():
        return candidate
    if (Path.cwd() / value).is_file():
        return Path.cwd() / value
    raise bad(where, "deepspeed_config.deepspeed_config_file", f"{value}: no such file")


# --- writing -------------------------------------------------------------------------------------------

def apply(doc: dict, changes: dict, imported: ImportedConfig) -> dict:
    doc = doc_copy(doc)
    engine = changes.get("engine") or imported.knobs["engine"]
    if "engine" in changes and changes["engine"] != imported.knobs["engine"]:
        fsdp_ckpt = _fsdp_get(doc.get("fsdp_config") or {}, "activation_checkpointing")
        if imported.knobs["engine"] == "fsdp" and fsdp_ckpt is not None and changes.get("checkpointing") != "off":
            # the run's checkpointing lives in fsdp_config; without FSDP the training arguments say it
            raise cannot(imported, "engine", engine, "its activation checkpointing is fsdp_config's "
                         "fsdp_activation_checkpointing, which goes with FSDP; set it in the training arguments")
        doc["distributed_type"] = ENGINE_NAME[engine]
        if engine != "deepspeed":
            doc.pop("deepspeed_config", None)
        if engine != "fsdp":
            doc.pop("fsdp_config", None)
        if engine == "deepspeed":
            doc["deepspeed_config"] = {"zero_stage": changes.get("zero_stage", imported.knobs.get("zero_stage", 2))}
        if engine == "fsdp":
            # with no fsdp_auto_wrap_policy accelerate wraps nothing (one FSDP unit: every weight gathered at once)
            doc["fsdp_config"] = {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                  "fsdp_reshard_after_forward": True, "fsdp_offload_params": False}
    with_file = bool((doc.get("deepspeed_config") or {}).get("deepspeed_config_file"))
    for knob, value in changes.items():
        if knob == "engine":
            continue
        if knob == "precision":
            names = {v: k for k, v in PRECISIONS.items() if v}
            if value is not None and value not in names:
                raise cannot(imported, knob, value, "accelerate's mixed_precision is bf16, fp16 or no")
            doc["mixed_precision"] = names.get(value, "no")
        elif knob in ("zero_stage", "offload_optimizer", "offload_param", "grad_accum", "zero3_init"):
            if engine != "deepspeed":
                if value in (None, "none") or knob == "grad_accum":
                    if knob == "grad_accum":
                        raise cannot(imported, knob, value, "the training arguments set it, not accelerate")
                    continue
                raise cannot(imported, knob, value, f"the config runs {engine}, not DeepSpeed")
            dsc = doc.setdefault("deepspeed_config", {})
            key = {"zero_stage": "zero_stage", "offload_optimizer": "offload_optimizer_device",
                   "offload_param": "offload_param_device", "grad_accum": "gradient_accumulation_steps",
                   "zero3_init": "zero3_init_flag"}[knob]
            if with_file and knob != "zero3_init":
                continue  # in the DeepSpeed JSON (write_files)
            if value is None:
                dsc.pop(key, None)
            else:
                dsc[key] = value
        elif knob in ds.KNOBS:
            if not with_file and value is not None:
                raise cannot(imported, knob, value, "accelerate's deepspeed_config has no such key; point "
                             "deepspeed_config_file at a DeepSpeed JSON")
        elif knob in ("fsdp_strategy", "fsdp_cpu_offload", "fsdp_cpu_ram_efficient_loading", "fsdp_version") or (
                knob == "checkpointing" and engine == "fsdp"):
            if engine != "fsdp":
                if value in (None, False):
                    continue
                raise cannot(imported, knob, value, f"the config runs {engine}, not FSDP")
            fsdp = doc.setdefault("fsdp_config", {})
            if knob == "fsdp_strategy":
                _strategy(fsdp, value, imported)
            elif knob == "fsdp_cpu_offload":
                fsdp[_fsdp_key(fsdp, "offload_params")] = bool(value)
            elif knob == "fsdp_cpu_ram_efficient_loading":
                fsdp[_fsdp_key(fsdp, "cpu_ram_efficient_loading")] = value is not False
            elif knob == "fsdp_version":
                fsdp[_fsdp_key(fsdp, "version")] = value or 1
            else:
                if value not in ("full", "off", None):
                    raise cannot(imported, knob, value, "FSDP activation checkpointing is full or off")
                key = _fsdp_key(fsdp, "activation_checkpointing")
                if value is None:
                    fsdp.pop(key, None)
                else:
                    fsdp[key] = value == "full"
        else:
            raise cannot(imported, knob, value, "an accelerate config carries the engine only; the training "
                         "arguments carry the rest")
    return doc


def _strategy(fsdp: dict, value, imported: ImportedConfig) -> None:
    version = _fsdp_get(fsdp, "version") or 1
    if _fsdp_get(fsdp, "sharding_strategy") is not None or (version == 1 and
                                                          _fsdp_get(fsdp, "reshard_after_forward") is None):
        fsdp[_fsdp_key(fsdp, "sharding_strategy")] = STRATEGY_NAME[value or "full_shard"]
    elif value in ("full_shard", "shard_grad_op", None):
        fsdp[_fsdp_key(fsdp, "reshard_after_forward")] = value != "shard_grad_op"
    else:
        raise cannot(imported, "fsdp_strategy", value, "FSDP2's reshard_after_forward is full_shard or shard_grad_op")


def write_files(imported: ImportedConfig, knobs: dict, folder: Path | None = None) -> list[WrittenFile]:
    """The file, and the DeepSpeed JSON it names when that changed (into `folder` when given, with
    `deepspeed_config_file` pointing there)."""
    changes = changed_knobs(imported, knobs)
    doc = apply(imported.doc, changes, imported)
    out, files = [], {}
    companion = imported.companions.get("deepspeed")
    if companion is not None and doc.get("distributed_type") == "DEEPSPEED":
        ds_changes = {k: v for k, v in changes.items() if k in ds.KNOBS}
        ds_text = ds.write(companion, {**companion.knobs, **ds_changes}) if ds_changes else companion.text
        target, reference = companion_target(companion, ds_text, folder)
        if reference is not None:
            doc["deepspeed_config"] = dict(doc["deepspeed_config"], deepspeed_config_file=reference)
        if ds_text != companion.text:
            out.append(WrittenFile(target, companion.text, ds_text))
        files[target] = ds_text
    text = yamltext.edit(imported.text, imported.doc, doc, imported.name)
    again = read(text, gpus=imported.world.get("num_gpus"), files=files, path=imported.path)
    verify_written(imported, again, changes)
    return [WrittenFile(imported.path, imported.text, text)] + out


def write(imported: ImportedConfig, knobs: dict) -> str:
    return write_files(imported, knobs)[0].new_text


def export(knobs: dict, *, gpus: int = 1, nodes: int = 1) -> str:
    """A new accelerate config (the layout `accelerate config` writes) for these engine knobs."""
    engine = knobs.get("engine", "ddp" if gpus * nodes > 1 else "single")
    doc = {"compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": ENGINE_NAME[engine]}
    if engine == "deepspeed":
        doc["deepspeed_config"] = {"zero_stage": knobs.get("zero_stage", 2),
                                   "offload_optimizer_device": knobs.get("offload_optimizer", "none"),
                                   "offload_param_device": knobs.get("offload_param", "none"),
                                   "zero3_init_flag": knobs.get("zero3_init", knobs.get("zero_stage") == 3)}
    if engine == "fsdp":
        fsdp = {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "fsdp_cpu_ram_efficient_loading": knobs.get("fsdp_cpu_ram_efficient_loading", True),
                "fsdp_offload_params": bool(knobs.get("fsdp_cpu_offload")),
                "fsdp_reshard_after_forward": knobs.get("fsdp_strategy", "full_shard") != "shard_grad_op",
                "fsdp_state_dict_type": "FULL_STATE_DICT"}
        if knobs.get("checkpointing") == "full":
            fsdp["fsdp_activation_checkpointing"] = True
        doc["fsdp_config"] = fsdp
    names = {v: k for k, v in PRECISIONS.items() if v}
    doc |= {"machine_rank": 0, "main_training_function": "main",
            "mixed_precision": names.get(knobs.get("precision") or "", "bf16"), "num_machines": nodes,
            "num_processes": gpus * nodes, "rdzv_backend": "static", "same_network": True, "use_cpu": False}
    lines = []
    for key, value in doc.items():
        lines += yamltext._block(key, value, 0, 2)
    return "\n".join(lines) + "\n"
