"""Real files of other releases and recipe repositories (issue 12 A): list items in YAML, keys of other TRL
releases, DeepSpeed's sub_group_size 0, legacy OpenRLHF commands without an attention flag, accelerate's
num_processes and FSDP rewrites. Each reader note reaches `memfit estimate`'s output."""
import json

import pytest
import yaml

from memfit.errors import MemfitError
from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import read_config, write_config_files, yamltext
from memfit.interfaces.formats.tables import table

# alignment-handbook's recipe layout (recipes/*/sft/config_*.yaml): a list of mappings under dataset_mixture,
# a list at its key's own indent, and keys of TRL releases before 0.20 / transformers before 4.56
HANDBOOK = """\
# Model arguments
model_name_or_path: Qwen/Qwen2.5-1.5B
torch_dtype: bfloat16
attn_implementation: flash_attention_2

# Data training arguments
chat_template: "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
dataset_mixture:
  datasets:
    - id: HuggingFaceH4/ultrachat_200k
      config: default
      split: train_sft
      columns:
        - messages
      weight: 0.5
    - id: HuggingFaceH4/no_robots
      config: default
      split: train
      columns:
      - messages
      weight: 1.0
  seed: 42
dataset_num_proc: 12
gradient_accumulation_steps: 4
gradient_checkpointing: true
max_seq_length: 2048
output_dir: data/Qwen2.5-1.5B-sft
overwrite_output_dir: true
per_device_train_batch_size: 8
report_to:
- wandb
warmup_ratio: 0.1
bf16: true
"""


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_yaml_list_items_are_not_duplicate_keys(tmp_path):
    path = tmp_path / "config_full.yaml"
    path.write_text(HANDBOOK)
    entries = yamltext.index(HANDBOOK, "x")
    assert ("dataset_mixture", "seed") in entries and ("dataset_mixture", "datasets", "id") not in entries
    imported = read_config(path, gpus=8)
    assert imported.knobs["seq_len"] == 2048
    # a rewrite keeps the list as it was (the editor replaces only what changed)
    new = write_config_files(imported, {"micro_batch": 4, "grad_accum": 8})[0].new_text
    assert yaml.safe_load(new)["dataset_mixture"] == yaml.safe_load(HANDBOOK)["dataset_mixture"]
    assert "per_device_train_batch_size: 4" in new


def test_a_true_duplicate_key_is_still_refused():
    with pytest.raises(MemfitError, match="duplicate key"):
        yamltext.index("a:\n  b: 1\n  b: 2\n", "x")


def test_keys_of_other_trl_releases_are_warnings_that_reach_the_output(tmp_path, capsys):
    path = tmp_path / "config_full.yaml"
    path.write_text(HANDBOOK)
    imported = read_config(path, gpus=8)
    release = table("hf")["source"]
    for key in ("dataset_mixture", "chat_template", "warmup_ratio", "overwrite_output_dir"):
        assert any(key in w and release in w for w in imported.warnings), key
    assert main(["estimate", "--from", str(path), "--gpu", "a100-80gb", "--gpus", "8", "--json"]) == 0
    assumptions = "\n".join(_json(capsys)["assumptions"])
    assert "warmup_ratio" in assumptions and release in assumptions
    assert "torch_dtype='bfloat16' read as dtype" in assumptions and "max_seq_length=2048 read as max_length" in assumptions


def test_older_names_of_memory_settings_are_read_and_written_as_spelled(tmp_path):
    """torch_dtype: bfloat16 loads bf16 weights (pure bf16); ignored, TRL's default float32 would make it mixed."""
    path = tmp_path / "config_full.yaml"
    path.write_text(HANDBOOK)
    assert read_config(path, gpus=8).knobs["precision"] == "bf16-pure"
    path.write_text(HANDBOOK.replace("torch_dtype: bfloat16\n", ""))
    imported = read_config(path, gpus=8)
    assert imported.knobs["precision"] == "bf16-mixed"
    new = write_config_files(imported, {"seq_len": 1024})[0].new_text
    assert "max_seq_length: 1024" in new and "max_length" not in new


def test_deepspeed_sub_group_size_zero_is_valid(tmp_path, capsys):
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    zero = {"stage": 3, "sub_group_size": 0, "offload_optimizer": {"device": "cpu"}}
    assert DeepSpeedZeroConfig(**zero).sub_group_size == 0  # DeepSpeed's own config accepts it
    with pytest.raises(Exception):
        DeepSpeedZeroConfig(**{**zero, "sub_group_size": -1})
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                                "bf16": {"enabled": True}, "zero_optimization": zero}))
    assert read_config(path).knobs["sub_group_size"] == 0
    capsys.readouterr()  # deepspeed's import logs to stdout
    assert main(["estimate", "meta-llama/Meta-Llama-3-8B", "--from", str(path), "--gpu", "a100-80gb", "--gpus",
                 "8", "--json"]) == 0
    assert _json(capsys)["verdict"] in ("fits", "tight", "oom")
    path.write_text(path.read_text().replace('"sub_group_size": 0', '"sub_group_size": -1'))
    assert main(["estimate", "meta-llama/Meta-Llama-3-8B", "--from", str(path), "--gpu", "a100-80gb"]) == 2


# the GLM-4 DPO report's public original: OpenRLHF's legacy flags, no --flash_attn
GLM_LEGACY = """\
deepspeed --num_gpus 8 --module openrlhf.cli.train_dpo \\
   --pretrain THUDM/glm-4-9b-chat \\
   --dataset OpenRLHF/preference_dataset_mixture2_and_safe_pku \\
   --max_len 2048 \\
   --micro_train_batch_size 1 \\
   --train_batch_size 128 \\
   --zero_stage 3 \\
   --bf16 \\
   --gradient_checkpointing \\
   --save_path ./checkpoint/glm4-9b-dpo
"""


def test_legacy_openrlhf_command_without_an_attention_flag_is_not_flash(tmp_path, capsys):
    from memfit.interfaces.formats.openrlhf import default_attention

    # each release's own default, from its argparse table
    assert default_attention("0.8.9", "train_dpo") == "eager" and default_attention("0.9.1", "train_dpo") == "flash"
    path = tmp_path / "train_dpo_glm4.sh"
    path.write_text(GLM_LEGACY)
    imported = read_config(path)
    assert imported.knobs["attention"] == "eager" and imported.variant == "0.8.9"
    assert main(["estimate", "--from", str(path), "--gpu", "a100-80gb", "--json"]) == 0
    assumptions = "\n".join(_json(capsys)["assumptions"])
    assert "no attention flag" in assumptions and "0.8.10-0.9.1 runs flash" in assumptions
    path.write_text(GLM_LEGACY.replace("   --bf16 \\\n", "   --bf16 \\\n   --flash_attn \\\n"))
    assert read_config(path).knobs["attention"] == "flash"
    # said explicitly for a release: that release's reading
    path.write_text(GLM_LEGACY)
    assert read_config(path, version="0.9.1").knobs["attention"] == "flash"


MULTI_GPU = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
mixed_precision: bf16
num_machines: 1
num_processes: 4
"""


def test_accelerate_num_processes_is_the_gpu_count(tmp_path, capsys):
    path = tmp_path / "multi_gpu.yaml"
    path.write_text(MULTI_GPU)
    model = "meta-llama/Meta-Llama-3-8B"
    assert main(["estimate", model, "--from", str(path), "--gpu", "a100-80gb"]) == 0
    assert f"\n{model} on 4 x" in capsys.readouterr().out  # the header, under the answer's first line
    assert main(["estimate", model, "--from", str(path), "--gpu", "a100-80gb", "--json"]) == 0
    assert any("4 GPUs as the file says" in a for a in _json(capsys)["assumptions"])
    assert main(["estimate", model, "--from", str(path), "--gpu", "a100-80gb", "--gpus", "2", "--json"]) == 0
    doc = _json(capsys)
    assert any("the file says 4 GPUs, the command line 2" in a for a in doc["assumptions"])


def test_accelerate_switch_to_fsdp_keeps_auto_wrapping(tmp_path):
    path = tmp_path / "multi_gpu.yaml"
    path.write_text(MULTI_GPU)
    imported = read_config(path, gpus=4)
    new = write_config_files(imported, {"engine": "fsdp", "fsdp_strategy": "full_shard", "fsdp_cpu_offload": True})
    fsdp = yaml.safe_load(new[0].new_text)["fsdp_config"]
    assert fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP" and fsdp["fsdp_offload_params"] is True


def test_an_fsdp_offload_change_is_written_as_fsdp_offload_params(examples):
    from memfit.facts.knobs import axes

    assert "fsdp_cpu_offload" in axes()["offload"]  # what `memfit fit` writes for an offload change
    imported = read_config(examples / "accelerate" / "fsdp_config.yaml", gpus=2)
    files = write_config_files(imported, {"fsdp_cpu_offload": True})
    written = yaml.safe_load(files[0].new_text)["fsdp_config"]
    assert written["fsdp_offload_params"] is True and written["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"


def test_fit_offloads_an_fsdp_run_that_needs_it(tmp_path, capsys, examples):
    path = examples / "accelerate" / "fsdp_config.yaml"
    assert main(["fit", str(path), "--model", "Qwen/Qwen2.5-14B", "--gpu", "a100-80gb", "--gpus", "2",
                 "--out", str(tmp_path / "out")]) == 0
    assert "offload: none -> cpu" in capsys.readouterr().out
    knobs = read_config(tmp_path / "out" / path.name, gpus=2).knobs
    assert knobs.get("fsdp_cpu_offload") or knobs.get("offload_optimizer") == "cpu"


def test_leaving_fsdp_does_not_drop_its_activation_checkpointing(examples):
    """fsdp2_config.yaml checkpoints through fsdp_config; a DeepSpeed rewrite would lose it (the run then OOMs)."""
    imported = read_config(examples / "accelerate" / "fsdp2_config.yaml", gpus=8)
    assert imported.knobs["checkpointing"] == "full"
    with pytest.raises(MemfitError, match="fsdp_activation_checkpointing"):
        write_config_files(imported, {"engine": "deepspeed", "zero_stage": 3})
