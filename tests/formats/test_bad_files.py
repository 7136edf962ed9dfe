"""Bad files: one clear line naming the file and the key, a MemfitError (the CLI exits 2), never a traceback."""
import json

import pytest

from memfit.errors import MemfitError
from memfit.interfaces.formats import read_config, write_config_files

LF_YAML = """\
### model
model_name_or_path: meta-llama/Llama-3.1-8B-Instruct

### method
stage: sft
finetuning_type: lora
lora_target: all

### train
per_device_train_batch_size: 4
gradient_accumulation_steps: 4
bf16: true
"""
DS_JSON = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 3}}
ACCELERATE = "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n" \
             "num_processes: 4\n"
OPENRLHF = "deepspeed --module openrlhf.cli.train_sft \\\n  --pretrain Qwen/Qwen2-7B-Instruct \\\n  --zero_stage 3 \\\n" \
           "  --micro_train_batch_size 4 \\\n  --bf16\n"
TRL = "model_name_or_path: Qwen/Qwen2-7B\nmax_length: 2048\nper_device_train_batch_size: 2\n"


def error_of(path, **options) -> str:
    with pytest.raises(MemfitError) as e:
        read_config(path, **options)
    message = str(e.value)
    assert "\n" not in message and "Traceback" not in message
    assert path.name in message, message
    return message


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text if isinstance(text, str) else json.dumps(text, indent=2))
    return path


# --- malformed --------------------------------------------------------------------------------------

def test_malformed_yaml(tmp_path):
    message = error_of(write(tmp_path, "train.yaml", LF_YAML + "lora_rank: [8\n"))
    assert "not valid YAML" in message and "line" in message


def test_malformed_json(tmp_path):
    message = error_of(write(tmp_path, "ds.json", '{"zero_optimization": {"stage": 3,}}'))
    assert "not valid JSON" in message and "line 1" in message


def test_malformed_openrlhf_quote(tmp_path):
    message = error_of(write(tmp_path, "run.sh", OPENRLHF.replace("--bf16", "--pretrain 'unclosed")))
    assert "cannot read the command" in message or "quote" in message


def test_yaml_that_is_not_a_mapping(tmp_path):
    assert "mapping" in error_of(write(tmp_path, "train.yaml", "- stage: sft\n- finetuning_type: lora\n"))


def test_duplicate_yaml_key(tmp_path):
    message = error_of(write(tmp_path, "train.yaml", LF_YAML + "per_device_train_batch_size: 8\n"))
    assert "per_device_train_batch_size" in message and "duplicate" in message


def test_duplicate_json_key(tmp_path):
    message = error_of(write(tmp_path, "ds.json", '{"zero_optimization": {"stage": 3, "stage": 2}}'))
    assert "stage" in message and "duplicate" in message


# --- unknown keys -----------------------------------------------------------------------------------

def test_deepspeed_unknown_zero_key(tmp_path):
    bad = {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket": 5e7}}
    message = error_of(write(tmp_path, "ds.json", bad))
    assert "zero_optimization.stage3_prefetch_bucket" in message and "stage3_prefetch_bucket_size" in message


def test_deepspeed_unknown_offload_key(tmp_path):
    bad = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memroy": False}}}
    message = error_of(write(tmp_path, "ds.json", bad))
    assert "offload_optimizer.pin_memroy" in message and "pin_memory" in message


def test_llamafactory_unknown_key(tmp_path):
    message = error_of(write(tmp_path, "train.yaml", LF_YAML + "gradient_checkpointing_disable: true\n"))
    assert "gradient_checkpointing_disable" in message and "LLaMA-Factory" in message


def test_trl_unknown_key_that_looks_like_a_memory_setting(tmp_path):
    """An unknown key is a warning (another release's key), unless memfit would then misread memory."""
    message = error_of(write(tmp_path, "sft.yaml", TRL + "max_seq_len: 4096\n"))
    assert "max_seq_len" in message and "memory setting" in message and "trl 1.16" in message


def test_trl_older_name_that_disagrees_with_the_new_one(tmp_path):
    message = error_of(write(tmp_path, "sft.yaml", TRL + "max_seq_length: 4096\n"))
    assert "max_seq_length" in message and "max_length" in message


def test_training_arguments_unknown_key(tmp_path):
    message = error_of(write(tmp_path, "args.json", {"output_dir": "o", "per_device_batch_size": 4}))
    assert "per_device_batch_size" in message


def test_accelerate_unknown_key(tmp_path):
    message = error_of(write(tmp_path, "acc.yaml", ACCELERATE + "num_gpus: 4\n"))
    assert "num_gpus" in message and "accelerate" in message


def test_accelerate_unknown_deepspeed_key(tmp_path):
    message = error_of(write(tmp_path, "acc.yaml", ACCELERATE.replace("zero_stage: 3", "zero_stage: 3\n  stage: 3")))
    assert "deepspeed_config.stage" in message


def test_openrlhf_unknown_flag(tmp_path):
    message = error_of(write(tmp_path, "run.sh", OPENRLHF.replace("--bf16", "--bf16 \\\n  --adam_ofload")))
    assert "--adam_ofload" in message and "--adam_offload" in message


def test_openrlhf_mixed_flag_styles(tmp_path):
    message = error_of(write(tmp_path, "run.sh", OPENRLHF.replace("--bf16", "--ds.adam_offload")))
    assert "unknown flag" in message


# --- wrong types ------------------------------------------------------------------------------------

def test_deepspeed_wrong_type(tmp_path):
    message = error_of(write(tmp_path, "ds.json", {"zero_optimization": {"stage": "three"}}))
    assert "zero_optimization.stage" in message and "three" in message


def test_deepspeed_stage_out_of_range(tmp_path):
    assert "zero_optimization.stage" in error_of(write(tmp_path, "ds.json", {"zero_optimization": {"stage": 4}}))


def test_deepspeed_wrong_bool(tmp_path):
    bad = {"zero_optimization": {"stage": 2, "overlap_comm": "yes"}}
    assert "zero_optimization.overlap_comm" in error_of(write(tmp_path, "ds.json", bad))


def test_llamafactory_wrong_type(tmp_path):
    message = error_of(write(tmp_path, "train.yaml", LF_YAML.replace("per_device_train_batch_size: 4",
                                                                      "per_device_train_batch_size: four")))
    assert "per_device_train_batch_size" in message and "integer" in message


def test_llamafactory_bad_choice(tmp_path):
    message = error_of(write(tmp_path, "train.yaml", LF_YAML + "flash_attn: fa4\n"))
    assert "flash_attn" in message and "fa2" in message


def test_trl_wrong_type(tmp_path):
    assert "max_length" in error_of(write(tmp_path, "sft.yaml", TRL.replace("2048", "long")))


def test_openrlhf_wrong_type(tmp_path):
    message = error_of(write(tmp_path, "run.sh", OPENRLHF.replace("--zero_stage 3", "--zero_stage three")))
    assert "--zero_stage" in message and "integer" in message


def test_openrlhf_shell_variable_for_a_number(tmp_path):
    message = error_of(write(tmp_path, "run.sh", OPENRLHF.replace("--micro_train_batch_size 4",
                                                                  "--micro_train_batch_size $MBS")))
    assert "--micro_train_batch_size" in message and "shell variable" in message


def test_accelerate_wrong_type(tmp_path):
    assert "num_processes" in error_of(write(tmp_path, "acc.yaml", ACCELERATE.replace("4", "four")))


# --- conflicting values -----------------------------------------------------------------------------

def test_train_batch_not_micro_times_accumulation_times_world(tmp_path):
    bad = {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
           "zero_optimization": {"stage": 2}}
    message = error_of(write(tmp_path, "ds.json", bad))
    assert "train_batch_size" in message and "30" in message


def test_train_batch_against_the_gpu_count(tmp_path):
    ok = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
          "zero_optimization": {"stage": 2}}
    path = write(tmp_path, "ds.json", ok)
    assert read_config(path).world["num_gpus"] == 4
    message = error_of(path, gpus=8)
    assert "train_batch_size" in message and "8 GPUs" in message


def test_openrlhf_global_batch_not_divisible(tmp_path):
    text = OPENRLHF.replace("--bf16", "--bf16 \\\n  --train_batch_size 30")
    assert "--train_batch_size" in error_of(write(tmp_path, "run.sh", text), gpus=4)


def test_yaml_batch_against_an_explicit_deepspeed_file(tmp_path):
    write(tmp_path, "ds.json", {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}})
    message = error_of(write(tmp_path, "train.yaml", LF_YAML + "deepspeed: ds.json\n"))
    assert "per_device_train_batch_size" in message and "ds.json" in message


def test_pure_bf16_with_zero3(tmp_path):
    write(tmp_path, "ds.json", DS_JSON)
    message = error_of(write(tmp_path, "train.yaml", LF_YAML + "pure_bf16: true\ndeepspeed: ds.json\n"))
    assert "pure_bf16" in message and "ZeRO-3" in message


def test_missing_deepspeed_file(tmp_path):
    message = error_of(write(tmp_path, "train.yaml", LF_YAML + "deepspeed: examples/deepspeed/nope.json\n"))
    assert "deepspeed" in message and "nope.json" in message


def test_accelerate_keys_beside_a_deepspeed_file(tmp_path):
    write(tmp_path, "ds.json", DS_JSON)
    text = ACCELERATE.replace("zero_stage: 3", "zero_stage: 3\n  deepspeed_config_file: ds.json")
    assert "deepspeed_config.zero_stage" in error_of(write(tmp_path, "acc.yaml", text))


def test_bf16_and_fp16(tmp_path):
    assert "fp16" in error_of(write(tmp_path, "train.yaml", LF_YAML + "fp16: true\n"))


def test_neat_packing_outside_sft(tmp_path):
    text = LF_YAML.replace("stage: sft", "stage: dpo") + "neat_packing: true\n"
    assert "neat_packing" in error_of(write(tmp_path, "train.yaml", text))


def test_unmodelled_quantization(tmp_path):
    assert "quantization_bit" in error_of(write(tmp_path, "train.yaml", LF_YAML + "quantization_bit: 2\n"))
    hqq = LF_YAML + "quantization_bit: 4\nquantization_method: hqq\n"
    assert "quantization_bit" in error_of(write(tmp_path, "hqq.yaml", hqq))


# --- files that are not what they seem ----------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(MemfitError, match="no such file"):
        read_config(tmp_path / "nope.yaml")


def test_unknown_format(tmp_path):
    with pytest.raises(MemfitError, match="cannot tell the format"):
        read_config(write(tmp_path, "notes.txt", "just some words\n"))


def test_a_knob_the_format_cannot_say(tmp_path):
    imported = read_config(write(tmp_path, "run.sh", OPENRLHF))
    with pytest.raises(MemfitError, match="pin_memory") as e:
        write_config_files(imported, {"offload_optimizer": "cpu", "pin_memory": False})
    assert "run.sh" in str(e.value) and "\n" not in str(e.value)


def test_cli_style_message_is_one_line(tmp_path, capsys):
    """What `memfit estimate --from` will print: one line, exit 2 (the CLI turns MemfitError into that)."""
    path = write(tmp_path, "ds.json", {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "gpu"}}})
    message = error_of(path)
    assert "offload_optimizer.device" in message
