"""Check what memfit writes with the frameworks' own code (optional: each framework is imported lazily).

Each `validate_*` function takes the text memfit wrote and runs the framework's real parser or
config class on it; it returns the framework's parsed view (for tests to compare with memfit's)
and raises `ValidationFailed` with the framework's own message when it refuses.

| format | what runs | needs |
| --- | --- | --- |
| deepspeed | `deepspeed.runtime.config.DeepSpeedConfig(dict)` (pydantic ZeRO / offload models) | deepspeed |
| hf | `transformers.TrainingArguments(**d)` / `trl.SFTConfig` / `trl.DPOConfig` via `HfArgumentParser.parse_dict` | transformers, trl |
| accelerate | `accelerate.commands.config.config_args.ClusterConfig.from_yaml_file`, then the `accelerate launch` argument names | accelerate |
| llamafactory | `llamafactory.hparams.get_train_args(dict)` in LLaMA-Factory's own virtual environment, under `torchrun` | a venv with llamafactory |
| openrlhf | the `argparse` parser of `openrlhf/cli/train_*.py`, rebuilt from the released source with `ast` | the openrlhf wheel (pip download, no install) |

The `*_table()` functions derive the key tables memfit's core reads (`memfit/interfaces/formats/tables/`)
from the same code, so a test can prove the stored tables match the framework.
"""
from __future__ import annotations

import ast
import dataclasses
import enum
import json
import os
import subprocess
import sys
import tempfile
import types
import typing
import zipfile
from pathlib import Path


class ValidationFailed(Exception):
    """The framework's own code refused the config; the message is the framework's."""


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        if isinstance(value, enum.Enum):
            return value.value
        if isinstance(value, tuple):
            return [_jsonable(v) for v in value]
        return None


def _kind(tp) -> dict:
    """A field's annotation -> {"type": int|float|bool|str|list|dict|any, "choices": [...]}."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        kinds = [_kind(a) for a in args if a is not type(None)]
        types_ = {k["type"] for k in kinds}
        if len(kinds) == 1:
            return kinds[0]
        if types_ == {"int", "float"}:
            return {"type": "float"}
        return {"type": "any"}
    if origin is typing.Literal:
        return {"type": "str", "choices": [_jsonable(a) for a in args]}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"type": "str", "choices": [m.value for m in tp]}
    if tp is bool:
        return {"type": "bool"}
    if tp is int:
        return {"type": "int"}
    if tp is float:
        return {"type": "float"}
    if tp is str or (isinstance(tp, type) and issubclass(tp, os.PathLike)):
        return {"type": "str"}
    if origin in (list, tuple) or tp in (list, tuple):
        return {"type": "list"}
    if origin is dict or tp is dict:
        return {"type": "dict"}
    return {"type": "any"}


def dataclass_table(cls) -> dict:
    hints = typing.get_type_hints(cls)
    table = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        spec = _kind(hints.get(f.name, typing.Any))
        if f.default is not dataclasses.MISSING:
            spec["default"] = _jsonable(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            spec["default"] = _jsonable(f.default_factory())
        table[f.name] = spec
    return dict(sorted(table.items()))


def pydantic_table(model) -> dict:
    table = {}
    for name, f in model.model_fields.items():
        spec = _kind(f.annotation)
        default = f.get_default(call_default_factory=True) if not f.is_required() else None
        spec["default"] = _jsonable(default)
        if (f.json_schema_extra or {}).get("deprecated"):
            spec["deprecated"] = True
        if hasattr(f.annotation, "model_fields") or any(hasattr(a, "model_fields") for a in typing.get_args(f.annotation)):
            spec = {"type": "dict"}
        table[f.alias or name] = spec
        if f.alias and f.alias != name:
            table[name] = dict(spec, alias_of=f.alias)
    return dict(sorted(table.items()))


# --- DeepSpeed ----------------------------------------------------------------------------------------

def deepspeed_table() -> dict:
    import deepspeed
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (DeepSpeedZeroOffloadOptimizerConfig,
                                                        DeepSpeedZeroOffloadParamConfig)

    return {"source": f"deepspeed {deepspeed.__version__}",
            "zero_optimization": pydantic_table(DeepSpeedZeroConfig),
            "offload_optimizer": pydantic_table(DeepSpeedZeroOffloadOptimizerConfig),
            "offload_param": pydantic_table(DeepSpeedZeroOffloadParamConfig)}


def validate_deepspeed(text: str, world_size: int = 1):
    """DeepSpeed's own config class on the JSON we wrote; returns its ZeRO config (defaults applied).

    "auto" values are what HF/accelerate fill; DeepSpeed alone drops them to its defaults, as
    `DeepSpeedConfigModel` does, so they validate either way.
    """
    import logging

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    from deepspeed.runtime.config import DeepSpeedConfig

    config = json.loads(text)
    batch = {k: config.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                         "gradient_accumulation_steps")}
    if any(v == "auto" for v in batch.values()):  # HF fills these from TrainingArguments
        config = {k: v for k, v in config.items() if k not in batch or v != "auto"}
        if not any(k in config for k in batch):
            config["train_micro_batch_size_per_gpu"] = 1
    for section in ("bf16", "fp16"):
        if isinstance(config.get(section), dict) and config[section].get("enabled") == "auto":
            config[section] = dict(config[section], enabled=False)
    if config.get("gradient_clipping") == "auto":
        config.pop("gradient_clipping")

    class _Mpu:  # DeepSpeedConfig asks the data-parallel world size of an mpu when there is no process group
        def get_data_parallel_world_size(self):
            return world_size

        def get_model_parallel_world_size(self):
            return 1

        def get_data_parallel_rank(self):
            return 0

        get_sequence_parallel_world_size = get_model_parallel_world_size
        get_sequence_data_parallel_world_size = get_data_parallel_world_size

    from unittest import mock

    try:  # no process group here: say rank 0, and let the mpu tell the data-parallel world size
        with mock.patch("deepspeed.runtime.config.dist.get_rank", return_value=0):
            return DeepSpeedConfig(config, mpu=_Mpu())
    except Exception as e:  # pydantic ValidationError, DeepSpeed's AssertionError: the framework's word
        raise ValidationFailed(f"DeepSpeed: {type(e).__name__}: {e}") from e


# --- transformers / TRL --------------------------------------------------------------------------------

def hf_table() -> dict:
    import transformers
    import trl
    from trl import DatasetMixtureConfig, DPOConfig, ModelConfig, ScriptArguments, SFTConfig

    return {"source": f"transformers {transformers.__version__}, trl {trl.__version__}",
            "TrainingArguments": dataclass_table(transformers.TrainingArguments),
            "SFTConfig": dataclass_table(SFTConfig), "DPOConfig": dataclass_table(DPOConfig),
            "ModelConfig": dataclass_table(ModelConfig), "ScriptArguments": dataclass_table(ScriptArguments),
            "DatasetMixtureConfig": dataclass_table(DatasetMixtureConfig)}


def validate_hf(text: str, variant: str = "training_args", cpu: bool = True):
    """transformers' / TRL's own argument classes, as `trl sft --config F` or `HfArgumentParser` read a file.

    TRL script configs mix ScriptArguments, the trainer config, ModelConfig and DatasetMixtureConfig
    in one file: the parser gets the same four classes as `trl/scripts/sft.py` / `dpo.py`, with
    `allow_extra_keys=False` (an unknown key is an error, as in TRL).
    `use_cpu=True` is added (never to the file) so bf16 passes on a machine without a GPU.
    """
    import yaml
    from transformers import HfArgumentParser, TrainingArguments

    doc = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    if variant == "training_args":
        classes = (TrainingArguments,)
    else:
        from trl import DatasetMixtureConfig, DPOConfig, ModelConfig, ScriptArguments, SFTConfig, TrlParser

        classes = (ScriptArguments, SFTConfig if variant == "sft" else DPOConfig, ModelConfig, DatasetMixtureConfig)
    doc = dict(doc)
    doc.setdefault("output_dir", "/tmp/memfit-validate")
    if isinstance(doc.get("deepspeed"), str):  # a path relative to the file: the caller passes the dict instead
        doc.pop("deepspeed")
    if cpu:
        doc["use_cpu"] = True
    parser = HfArgumentParser(classes) if variant == "training_args" else TrlParser(classes)
    try:
        return parser.parse_dict(doc, allow_extra_keys=False)
    except Exception as e:
        raise ValidationFailed(f"{classes[-1 if len(classes) == 1 else 1].__name__}: {type(e).__name__}: {e}") from e


# --- accelerate ----------------------------------------------------------------------------------------

def accelerate_table() -> dict:
    import accelerate
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser

    dests = sorted({a.dest for a in launch_command_parser()._actions})
    top = dataclass_table(ClusterConfig)
    return {"source": f"accelerate {accelerate.__version__}", "top": top,
            "deepspeed_config": [d for d in dests if not d.startswith("fsdp_")],
            "fsdp_config": [d[len("fsdp_"):] for d in dests if d.startswith("fsdp_")]}


def validate_accelerate(text: str):
    """accelerate's own loader for the YAML (unknown top-level keys, enum values), then the launch
    argument names every `deepspeed_config` / `fsdp_config` key is copied onto (others are ignored)."""
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        config = ClusterConfig.from_yaml_file(f.name)
    except Exception as e:
        raise ValidationFailed(f"accelerate: {type(e).__name__}: {e}") from e
    finally:
        os.unlink(f.name)
    dests = {a.dest for a in launch_command_parser()._actions}
    for key in config.deepspeed_config:
        if key not in dests:
            raise ValidationFailed(f"accelerate: deepspeed_config.{key} is not an `accelerate launch` argument")
    for key in config.fsdp_config:
        if (key if key.startswith("fsdp") else "fsdp_" + key) not in dests:
            raise ValidationFailed(f"accelerate: fsdp_config.{key} is not an `accelerate launch` argument")
    return config


# --- LLaMA-Factory (its own venv) ---------------------------------------------------------------------

LLAMAFACTORY_VENV = Path(os.environ.get("MEMFIT_LLAMAFACTORY_VENV",
                                        Path(__file__).resolve().parents[3] / ".venvs" / "llamafactory"))

_LF_SCRIPT = r"""
import json, sys, dataclasses
doc = json.load(open(sys.argv[1]))
if sys.argv[2] == "table":
    from llamafactory.hparams import (DataArguments, FinetuningArguments, GeneratingArguments,
                                      ModelArguments, TrainingArguments)
    import llamafactory
    sys.path.insert(0, sys.argv[3])
    from memfit.interfaces.formats.validate import dataclass_table
    print("MEMFIT-RESULT " + json.dumps({"version": llamafactory.__version__, "fields": {c.__name__: dataclass_table(c)
        for c in (ModelArguments, DataArguments, TrainingArguments, FinetuningArguments, GeneratingArguments)}}))
    sys.exit(0)
from llamafactory.hparams import get_train_args
model_args, data_args, training_args, finetuning_args, generating_args = get_train_args(doc)
print("MEMFIT-RESULT " + json.dumps({
    "finetuning_type": finetuning_args.finetuning_type, "stage": finetuning_args.stage,
    "lora_rank": finetuning_args.lora_rank, "lora_target": finetuning_args.lora_target,
    "use_dora": finetuning_args.use_dora, "pure_bf16": finetuning_args.pure_bf16,
    "use_unsloth_gc": model_args.use_unsloth_gc,
    "disable_gradient_checkpointing": model_args.disable_gradient_checkpointing,
    "flash_attn": str(getattr(model_args.flash_attn, "value", model_args.flash_attn)),
    "quantization_bit": model_args.quantization_bit, "enable_liger_kernel": model_args.enable_liger_kernel,
    "cutoff_len": data_args.cutoff_len, "packing": data_args.packing, "neat_packing": data_args.neat_packing,
    "per_device_train_batch_size": training_args.per_device_train_batch_size,
    "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
    "deepspeed": training_args.deepspeed, "bf16": training_args.bf16, "fp16": training_args.fp16,
    "optim": str(getattr(training_args.optim, "value", training_args.optim)),
}))
"""


def _lf_python() -> Path:
    python = LLAMAFACTORY_VENV / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"no LLaMA-Factory virtual environment at {LLAMAFACTORY_VENV} "
                                "(see tests/formats/README.md)")
    return python


def _run_lf(doc: dict, mode: str, cwd: Path | None = None) -> str:
    python = _lf_python()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "args.json").write_text(json.dumps(doc))
        (Path(tmp) / "run.py").write_text(_LF_SCRIPT)
        env = dict(os.environ, DISABLE_VERSION_CHECK="1", FORCE_TORCHRUN="1", CUDA_VISIBLE_DEVICES="",
                   TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
        torchrun = [str(python), "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port",
                    str(29500 + os.getpid() % 1000)]
        cmd = torchrun + [str(Path(tmp) / "run.py"), str(Path(tmp) / "args.json"), mode]
        if mode == "table":
            cmd = [str(python), str(Path(tmp) / "run.py"), str(Path(tmp) / "args.json"), mode,
                   str(Path(__file__).resolve().parents[3])]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd or tmp, timeout=600)
    if done.returncode != 0:
        tail = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        # the child's own exception ("[rank0]: ValueError: ..."), not torchrun's report about the child
        errors = [line for line in tail if line.startswith("[rank0]:") and "Error" in line] or [
            line for line in tail if "Error" in line or "error" in line]
        raise ValidationFailed(f"LLaMA-Factory: {(errors or tail or ['exit ' + str(done.returncode)])[-1]}")
    return done.stdout


def validate_llamafactory(text: str, base_dir: Path | None = None) -> dict:
    """`llamafactory.hparams.get_train_args` on the YAML, in LLaMA-Factory's venv, under torchrun.

    Run from `base_dir` so a relative `deepspeed:` path resolves as it does for the user. `use_cpu`
    is added only for this check (TrainingArguments refuses bf16 on a machine without a GPU).
    """
    import yaml

    doc = yaml.safe_load(text)
    doc["use_cpu"] = True
    doc.setdefault("output_dir", "/tmp/memfit-validate")
    return _result(_run_lf(doc, "parse", cwd=base_dir))


def _result(stdout: str):
    line = next(x for x in stdout.splitlines() if x.startswith("MEMFIT-RESULT "))
    return json.loads(line[len("MEMFIT-RESULT "):])


def llamafactory_table() -> dict:
    out = _result(_run_lf({}, "table"))
    return {"source": f"llamafactory {out['version']}", **out["fields"]}


# --- OpenRLHF: the argparse parser, rebuilt from the released source ----------------------------------

OPENRLHF_VERSIONS = ("0.8.9", "0.9.1", "0.10.1", "0.11.2")
OPENRLHF_SCRIPTS = ("train_sft", "train_dpo", "train_rm")
WHEEL_CACHE = Path(os.environ.get("MEMFIT_WHEEL_CACHE", Path(tempfile.gettempdir()) / "memfit-wheels"))


def openrlhf_source(version: str, script: str) -> str:
    """The script's source from the released wheel (pip download, no install: the package imports
    flash_attn, which needs CUDA)."""
    return openrlhf_file(version, f"openrlhf/cli/{script}.py")


def openrlhf_file(version: str, path: str) -> str:
    """A file of the released wheel, e.g. openrlhf/utils/deepspeed/deepspeed_utils.py."""
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    wheels = list(WHEEL_CACHE.glob(f"openrlhf-{version}-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"openrlhf=={version}",
                        "-d", str(WHEEL_CACHE)], check=True, capture_output=True, timeout=300)
        wheels = list(WHEEL_CACHE.glob(f"openrlhf-{version}-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        name = next(n for n in z.namelist() if n.endswith(path))
        return z.read(name).decode()


def openrlhf_train_ds_config(source: str, **arguments) -> dict:
    """Run get_train_ds_config of (an edited copy of) OpenRLHF's deepspeed_utils.py: the DeepSpeed config
    it hands to deepspeed.initialize (that module imports only deepspeed, torch and packaging)."""
    namespace: dict = {"__name__": "openrlhf_deepspeed_utils"}
    exec(compile(source, "openrlhf/utils/deepspeed/deepspeed_utils.py", "exec"), namespace)
    return namespace["get_train_ds_config"](**arguments)


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        try:  # int(1e8) and the like
            return eval(compile(ast.Expression(node), "<flag>", "eval"), {"__builtins__": {}, "int": int, "float": float})
        except Exception:
            return None


def argparse_table(source: str) -> dict:
    """Every `parser.add_argument(...)` of a script, as plain data: flags -> type, default, action, ..."""
    table = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant)]
        spec = {}
        for kw in node.keywords:
            if kw.arg in ("help", "metavar"):
                continue
            if kw.arg == "type":
                spec["type"] = ast.unparse(kw.value)
            else:
                spec[kw.arg] = _jsonable(_literal(kw.value))
        spec.setdefault("dest", names[0].lstrip("-").replace("-", "_"))
        for name in names:
            table[name] = spec
    return dict(sorted(table.items()))


def openrlhf_table() -> dict:
    return {"source": "openrlhf " + ", ".join(OPENRLHF_VERSIONS),
            "versions": {v: {s: argparse_table(openrlhf_source(v, s)) for s in OPENRLHF_SCRIPTS}
                         for v in OPENRLHF_VERSIONS}}


def openrlhf_parser(source: str):
    """Run the script's own `add_argument` calls on a fresh parser (no other code of the script runs)."""
    import argparse

    parser = argparse.ArgumentParser(exit_on_error=False)

    def error(message):
        raise ValidationFailed(f"OpenRLHF argparse: {message}")

    parser.error = error
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            call = ast.Call(func=ast.Name("add_argument", ast.Load()), args=node.args, keywords=node.keywords)
            code = compile(ast.fix_missing_locations(ast.Expression(call)), "<openrlhf>", "eval")
            from datetime import datetime

            eval(code, {"add_argument": parser.add_argument, "int": int, "float": float, "str": str,
                        "datetime": datetime})
    return parser


def validate_openrlhf(command_args: list[str], version: str, script: str = "train_sft"):
    """Parse the arguments memfit wrote with OpenRLHF's own parser of that release."""
    parser = openrlhf_parser(openrlhf_source(version, script))
    try:
        return parser.parse_args(command_args)
    except Exception as e:
        raise ValidationFailed(f"OpenRLHF {version} {script}: {e}") from e


def write_tables(folder: Path | None = None) -> None:
    """Regenerate memfit/interfaces/formats/tables/*.json from the installed frameworks (a maintainer's step)."""
    folder = folder or Path(__file__).parent / "tables"
    for name, make in (("deepspeed", deepspeed_table), ("hf", hf_table), ("accelerate", accelerate_table),
                       ("openrlhf", openrlhf_table), ("llamafactory", llamafactory_table)):
        (folder / f"{name}.json").write_text(json.dumps(make(), indent=1, sort_keys=False) + "\n")


if __name__ == "__main__":
    write_tables()
