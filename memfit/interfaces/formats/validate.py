"""Check what memfit writes with the frameworks' own code (optional: each framework is imported lazily).

Each `validate_*` function takes the text memfit wrote and runs the framework's real parser or
config class on it; it returns the framework's parsed view (for tests to compare with memfit's)
and raises `ValidationFailed` with the framework's own message when it refuses.

| format | what runs | needs |
| --- | --- | --- |
| deepspeed | `deepspeed.runtime.config.DeepSpeedConfig(dict)` (pydantic ZeRO / offload models) | deepspeed |
| hf | `transformers.TrainingArguments(**d)` / `trl.SFTConfig` / `trl.DPOConfig` via `HfArgumentParser.parse_dict` | transformers, trl |
| accelerate | `accelerate.commands.config.config_args.ClusterConfig.from_yaml_file`, then the `accelerate launch` argument names | accelerate |
| llamafactory | `llamafactory.hparams.get_train_args(dict)` (a launch's flags: `(list)`) in LLaMA-Factory's own virtual environment, one process for all checks | a venv with llamafactory |
| openrlhf | the `argparse` parser of `openrlhf/cli/train_*.py`, rebuilt from the released source with `ast` | the openrlhf wheel (pip download, no install) |

The `*_table()` functions derive the key tables memfit's core reads (`memfit/interfaces/formats/tables/`)
from the same code, so a test can prove the stored tables match the framework.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from memfit.interfaces.formats.framework_tables import ValidationFailed, dataclass_table, pydantic_table
from memfit.interfaces.formats.validate_llamafactory_process import ParserProcess
from memfit.interfaces.formats.validate_openrlhf import openrlhf_table


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
    classes: tuple[type, ...]
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
    # transformers types the classes as NewType("DataClassType", Any), which no dataclass matches without a wrapper
    parser = HfArgumentParser(classes) if variant == "training_args" else TrlParser(classes)  # type: ignore[arg-type]
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

_LF_TABLE = r"""
import json, sys
import llamafactory
from llamafactory.hparams import (DataArguments, FinetuningArguments, GeneratingArguments, ModelArguments,
                                  TrainingArguments)
sys.path.insert(0, sys.argv[1])
from memfit.interfaces.formats.framework_tables import dataclass_table
print("MEMFIT-RESULT " + json.dumps({"version": llamafactory.__version__, "fields": {c.__name__: dataclass_table(c)
    for c in (ModelArguments, DataArguments, TrainingArguments, FinetuningArguments, GeneratingArguments)}}))
"""
# what a check reports of get_train_args' parsed arguments: key -> the dataclass it lives in
_LF_PARSED = {**dict.fromkeys(("finetuning_type", "stage", "lora_rank", "lora_target", "use_dora", "pure_bf16"),
                              "finetuning"),
              **dict.fromkeys(("use_unsloth_gc", "disable_gradient_checkpointing", "flash_attn", "quantization_bit",
                               "double_quantization", "enable_liger_kernel"), "model"),
              **dict.fromkeys(("cutoff_len", "packing", "neat_packing"), "data"),
              **dict.fromkeys(("per_device_train_batch_size", "gradient_accumulation_steps", "deepspeed", "bf16",
                               "fp16", "optim"), "training")}
_LF_PROCESS: list[ParserProcess] = []  # started on the first check, kept for the rest


def _lf_python() -> Path:
    python = LLAMAFACTORY_VENV / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"no LLaMA-Factory virtual environment at {LLAMAFACTORY_VENV} "
                                "(see tests/formats/README.md)")
    return python


def _parse_lf(doc, cwd: Path | None) -> dict:
    if not _LF_PROCESS:
        _LF_PROCESS.append(ParserProcess(_lf_python(), _LF_PARSED))
    return _LF_PROCESS[0].parse(doc, cwd)


def validate_llamafactory(text: str, base_dir: Path | None = None) -> dict:
    """`llamafactory.hparams.get_train_args` on the YAML, in LLaMA-Factory's venv (one process for every check:
    validate_llamafactory_process.py).

    Run from `base_dir` so a relative `deepspeed:` path resolves as it does for the user. `use_cpu`
    is added only for this check (TrainingArguments refuses bf16 on a machine without a GPU).
    """
    import yaml

    doc = yaml.safe_load(text)
    doc["use_cpu"] = True
    doc.setdefault("output_dir", "/tmp/memfit-validate")
    return _parse_lf(doc, base_dir)


def validate_llamafactory_flags(args: list[str], base_dir: Path | None = None) -> dict:
    """`get_train_args` on a launch's `--key value` words, as LLaMA-Factory's src/train.py hands it sys.argv[1:]
    (HfArgumentParser.parse_args_into_dataclasses, an unknown flag refused), in its venv."""
    extra = [] if "--output_dir" in args else ["--output_dir", "/tmp/memfit-validate"]
    return _parse_lf([*args, "--use_cpu", "true", *extra], base_dir)


def _result(stdout: str):
    line = next(x for x in stdout.splitlines() if x.startswith("MEMFIT-RESULT "))
    return json.loads(line[len("MEMFIT-RESULT "):])


def llamafactory_table() -> dict:
    done = subprocess.run([str(_lf_python()), "-c", _LF_TABLE, str(Path(__file__).resolve().parents[3])],
                          capture_output=True, text=True, env=dict(os.environ, DISABLE_VERSION_CHECK="1"), timeout=600)
    if done.returncode != 0:
        raise ValidationFailed(f"LLaMA-Factory: {(done.stderr.strip().splitlines() or ['exit'])[-1]}")
    out = _result(done.stdout)
    return {"source": f"llamafactory {out['version']}", **out["fields"]}


def write_tables(folder: Path | None = None) -> None:

    """Regenerate memfit/interfaces/formats/tables/*.json from the installed frameworks (a maintainer's step)."""
    folder = folder or Path(__file__).parent / "tables"
    for name, make in (("deepspeed", deepspeed_table), ("hf", hf_table), ("accelerate", accelerate_table),
                       ("openrlhf", openrlhf_table), ("llamafactory", llamafactory_table)):
        (folder / f"{name}.json").write_text(json.dumps(make(), indent=1, sort_keys=False) + "\n")


if __name__ == "__main__":
    write_tables()
