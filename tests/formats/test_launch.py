"""Launch scripts and several --from files (memfit/interfaces/formats/launch*.py): each example launch reads as the
files it names read by hand, GPU counts come from the launcher, what is not modelled is named, bad launches are one
line with exit 2."""
import argparse
import json
import shlex
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cards
from memfit.interfaces.cli.args import blank_arguments, scenario_and_file
from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import knobs_from_scenario, read_config, read_configs

HERE = Path(__file__).parent
LAUNCH = HERE / "launch_examples"
EX = HERE / "examples"
GPU = ["--gpu", "a100-80gb"]


@pytest.fixture
def launches(tmp_path) -> Path:
    """The launch examples beside the config examples they name (as in the repository)."""
    shutil.copytree(EX, tmp_path / "examples")
    shutil.copytree(LAUNCH, tmp_path / "launch_examples")
    return tmp_path / "launch_examples"


def scenario(files, **typed):
    files = [str(f) for f in files]
    a = argparse.Namespace(**{**blank_arguments(), "gpu": "a100-80gb", "from_file": files, **typed})
    return scenario_and_file(a)


def same_run(script, by_hand: list, gpus: int | None, model: str | None = None, **typed):
    """estimate --from SCRIPT and estimate --from FILES --gpus N (the files as a user would write them, `typed`
    on the command line beside them): the same Scenario knobs, model and GPU count."""
    s, imported, notes = scenario([script])
    h, _, _ = scenario(by_hand, model=model, **({"gpus_per_node": gpus} if gpus else {}), **typed)
    assert knobs_from_scenario(s) == knobs_from_scenario(h)
    assert s.model.id == h.model.id
    assert s.hardware.world_size == (gpus or 1)
    return imported, notes


def write(folder: Path, name: str, doc) -> Path:
    path = folder / name
    path.write_text(json.dumps(doc) if name.endswith(".json") else yaml.safe_dump(doc, sort_keys=False))
    return path


# --- every example launch is the files it names --------------------------------------------------------------

def test_llamafactory_ds3_launch_is_its_yaml(launches):
    yaml_path = launches.parent / "examples/llamafactory/examples/train_lora/llama3_lora_sft_ds3.yaml"
    imported, notes = same_run(launches / "llamafactory_lora_sft_ds3.sh", [yaml_path], 4)
    assert "4 GPUs from NPROC_PER_NODE" in " ".join(notes)
    assert imported.knobs == read_config(yaml_path, gpus=4).knobs


def test_llamafactory_overrides_are_merged_over_the_yaml(launches, tmp_path):
    src = launches.parent / "examples/llamafactory/examples/train_lora/llama3_lora_sft.yaml"
    doc = {**yaml.safe_load(src.read_text()), "per_device_train_batch_size": 2, "cutoff_len": 4096,
           "learning_rate": 5e-5}
    imported, notes = same_run(launches / "llamafactory_overrides.sh", [write(tmp_path, "by_hand.yaml", doc)], 2)
    assert (imported.knobs["micro_batch"], imported.knobs["seq_len"]) == (2, 4096)
    assert any("cutoff_len=4096 over llama3_lora_sft.yaml" in n for n in notes)


def test_trl_accelerate_zero3_launch(launches, tmp_path):
    flags = {"model_name_or_path": "Qwen/Qwen2-0.5B", "dataset_name": "trl-lib/Capybara", "learning_rate": 2e-5,
             "num_train_epochs": 1, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 8,
             "gradient_checkpointing": True, "max_length": 2048, "eos_token": "<|im_end|>", "eval_strategy": "steps",
             "eval_steps": 100, "output_dir": "Qwen2-0.5B-SFT", "push_to_hub": True}
    acc = launches / "trl/examples/accelerate_configs/deepspeed_zero3.yaml"
    imported, _ = same_run(launches / "trl/sft_zero3.sh", [write(tmp_path, "sft.yaml", flags), acc], 8)
    assert imported.knobs["zero_stage"] == 3 and imported.knobs["micro_batch"] == 2


def test_trl_dpo_module_launch(launches, tmp_path):
    flags = {"dataset_name": "trl-lib/ultrafeedback_binarized", "model_name_or_path": "Qwen/Qwen2-0.5B-Instruct",
             "learning_rate": 5e-6, "num_train_epochs": 1, "per_device_train_batch_size": 2,
             "gradient_accumulation_steps": 8, "gradient_checkpointing": True, "max_length": 1024, "use_peft": True,
             "lora_r": 32, "lora_alpha": 16, "output_dir": "Qwen2-0.5B-DPO", "remove_unused_columns": False}
    imported, _ = same_run(launches / "trl/dpo_module.sh", [write(tmp_path, "dpo_config.yaml", flags)], None)
    assert imported.knobs["method"] == "dpo" and imported.knobs["lora_rank"] == 32


def test_trl_cli_config_with_flags_over_it(launches, tmp_path):
    doc = {**yaml.safe_load((launches / "trl/examples/cli_configs/example_config.yaml").read_text()),
           "per_device_train_batch_size": 8, "bf16": True}
    imported, _ = same_run(launches / "trl/sft_cli.txt", [write(tmp_path, "sft.yaml", doc)], None)
    assert imported.knobs["micro_batch"] == 8


def test_alignment_handbook_recipe_with_accelerate_flags(launches, tmp_path):
    folder = launches / "alignment_handbook/recipes"
    recipe = {**yaml.safe_load((folder / "zephyr-7b-beta/sft/config_full.yaml").read_text()),
              "per_device_train_batch_size": 4, "gradient_accumulation_steps": 8}
    acc = {**yaml.safe_load((folder / "accelerate_configs/zero3.yaml").read_text()), "num_processes": 4}
    imported, notes = same_run(launches / "alignment_handbook/launch_sft.sh",
                               [write(tmp_path, "recipe.yaml", recipe), write(tmp_path, "acc.yaml", acc)], 4)
    assert imported.knobs["seq_len"] == 2048 and imported.knobs["zero_stage"] == 3
    assert any("--num_processes" in n for n in notes)


def test_deepspeed_chat_script_flags_are_read(launches, tmp_path):
    """DeepSpeed-Chat's main.py: its own flags (not TrainingArguments) are the run, the DeepSpeed config it builds
    in code included; nothing is left unread."""
    s, imported, notes = scenario([launches / "deepspeed_examples/run_llama2_7b.sh"])
    assert imported.model_name == "meta-llama/Llama-2-7b-hf" and imported.world["num_gpus"] == 8
    assert (s.engine, s.zero_stage, s.offload_optimizer, s.offload_param) == ("deepspeed", 3, "none", "none")
    assert (s.micro_batch, s.grad_accum, s.seq_len, s.padding) == (4, 1, 512, "padded")  # --max_seq_len, padded
    assert (s.checkpointing, s.precision, s.reduce_bucket_size) == ("full", "fp16-mixed", 500_000_000)
    assert s.unread == () and "main.py's defaults: --dtype fp16" in " ".join(notes)
    assert "not read" not in " ".join(notes)


def _dschat(tmp_path, flags: str) -> Path:
    return write_text(tmp_path / "run.sh", f"deepspeed --num_gpus 8 main.py --model_name_or_path "
                                           f"meta-llama/Llama-2-7b-hf --data_split 2,4,4 {flags}\n")


def write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_deepspeed_chat_defaults_and_offload_below_zero3(tmp_path):
    """main.py's own defaults (micro-batch 16, ZeRO-0, fp16, 512 tokens); --offload under ZeRO-2 moves the
    optimizer only (DeepSpeed hands offload_param to ZeRO-3 alone)."""
    s = scenario([_dschat(tmp_path, "")])[0]
    assert (s.micro_batch, s.grad_accum, s.zero_stage, s.precision, s.seq_len) == (16, 1, 0, "fp16-mixed", 512)
    assert s.checkpointing == "off"
    s = scenario([_dschat(tmp_path, "--zero_stage 2 --offload --dtype bf16")])[0]
    assert (s.zero_stage, s.offload_optimizer, s.offload_param, s.precision) == (2, "cpu", "none", "bf16-mixed")
    s = scenario([_dschat(tmp_path, "--zero_stage 3 --offload")])[0]
    assert (s.offload_optimizer, s.offload_param) == ("cpu", "cpu")


def test_deepspeed_chat_config_is_one_deepspeed_accepts():
    from memfit.interfaces.formats import launch_dschat, validate

    v = launch_dschat.values({"model_name_or_path": "m", "zero_stage": 3, "offload": True, "dtype": "bf16"}, "t")
    doc = launch_dschat.ds_config(v)
    doc["train_batch_size"] = 16 * 8  # main.py's micro-batch x world size x accumulation, on 8 GPUs
    zero = validate.validate_deepspeed(json.dumps(doc), world_size=8).zero_config
    assert zero.stage == 3 and zero.offload_param.device == "cpu" and zero.offload_optimizer.device == "cpu"


@pytest.mark.parametrize("flags, needle", [
    ("--lora_dim 8", "--lora_dim 8: "),
    ("--dropout 0.1", "--dropout 0.1: "),
])
def test_deepspeed_chat_settings_memfit_does_not_model_are_not_read(tmp_path, flags, needle):
    s = scenario([_dschat(tmp_path, flags)])[0]
    assert len(s.unread) == 1 and needle in s.unread[0] and "not modelled" in s.unread[0]


@pytest.mark.parametrize("flags, needle", [
    ("--deepspeed_config ds.json", "main.py builds its own DeepSpeed config"),
    ("--offload yes", "is a switch in main.py"),
    ("--dtype fp32", "expected one of fp16, bf16"),
    ("--zero_stage two", "--zero_stage"),
])
def test_deepspeed_chat_flags_main_py_would_reject_are_one_line(tmp_path, capsys, flags, needle):
    assert main(["estimate", "--from", str(_dschat(tmp_path, flags)), *GPU]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("memfit: error:") and needle in err, err


def test_deepspeed_chat_table_names_deepspeeds_own_flags():
    """The flags deepspeed.add_config_arguments adds to main.py's parser are the table's (the installed DeepSpeed)."""
    import deepspeed

    from memfit.interfaces.formats import launch_dschat

    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    added = {a.dest for a in parser._actions if a.option_strings and a.dest != "help"}
    facts = launch_dschat.facts()
    assert added == {k for k, v in facts["arguments"].items() if v.get("added_by")}
    assert facts["repo"] and facts["path"].endswith("main.py") and len(facts["commit"]) == 40
    assert set(facts["detect"]) <= set(facts["arguments"])


def test_deepspeed_chat_flags_say_what_they_can_and_refuse_the_rest(launches):
    from memfit.errors import MemfitError
    from memfit.interfaces.formats.launch_sources import read_launch
    from memfit.interfaces.formats.launch_write import write as write_launch

    launch = read_launch([launches / "deepspeed_examples/run_llama2_7b.sh"], None)
    files = write_launch(launch, {"offload_optimizer": "cpu", "offload_param": "cpu", "micro_batch": 2,
                                  "grad_accum": 2})
    new = files[0].new_text
    assert "\n   --offload \\\n" in new and "--per_device_train_batch_size 2 " in new
    assert "--gradient_accumulation_steps 2 " in new and len(files) == 1
    assert read_configs(write_text(launches / "deepspeed_examples/new.sh", new)).knobs["offload_param"] == "cpu"
    for knobs, needle in [({"offload_optimizer": "cpu"}, "moves the optimizer and the parameters"),
                          ({"checkpointing": "off"}, "drop this switch"),
                          ({"checkpointing": "every_n"}, "needs a code edit"),
                          ({"engine": "fsdp"}, "always runs the DeepSpeed engine"),
                          ({"zero_stage": 2}, "shell variable"),
                          ({"loss": "liger"}, "no file of the launch can say")]:
        with pytest.raises(MemfitError, match=needle):
            write_launch(launch, knobs)


def test_run_clm_reads_its_block_size_and_dtype(tmp_path):
    """transformers' run_clm.py: --block_size is every row's length; --dtype float32 trains fp32 weights under
    autocast; without --block_size, or with another model's config, the run is not the one memfit reads."""
    def run_clm(flags: str):
        path = write_text(tmp_path / "clm.sh", "torchrun --nproc_per_node 2 run_clm.py --model_name_or_path "
                                               f"Qwen/Qwen2.5-1.5B --dataset_name wikitext --bf16 {flags}\n")
        return scenario([path])[0]

    s = run_clm("--block_size 512 --dtype float32")
    assert (s.seq_len, s.padding, s.precision, s.unread) == (512, "padded", "bf16-mixed", ())
    assert run_clm("--block_size 512").precision == "bf16-pure"  # the checkpoint's bf16 weights
    unread = run_clm("").unread
    assert len(unread) == 1 and "--block_size not given" in unread[0]
    unread = run_clm("--block_size 512 --config_name gpt2").unread
    assert len(unread) == 1 and "--config_name gpt2" in unread[0]


def test_run_clm_table_holds_no_training_argument():
    """run_clm.py's HfArgumentParser would refuse a field two dataclasses share: none is TrainingArguments'."""
    import dataclasses

    from transformers import TrainingArguments

    from memfit.interfaces.formats import launch_run_clm

    facts = launch_run_clm.facts()
    assert not set(facts["arguments"]) & {f.name for f in dataclasses.fields(TrainingArguments)}
    assert facts["path"].endswith("run_clm.py") and len(facts["commit"]) == 40


def test_a_launcher_flag_is_added_before_the_script_on_the_launchers_own_line(tmp_path):
    """accelerate's new flag goes where the launcher's flags are: before the script word on a one-line command,
    as a line of its own before the script's line when the script starts a line."""
    from memfit.interfaces.formats.launch_sources import read_launch
    from memfit.interfaces.formats.launch_write import write as write_launch

    one = write_text(tmp_path / "one.sh", "accelerate launch --use_deepspeed --zero_stage 2 train.py "
                                          "--model_name_or_path meta-llama/Llama-2-7b-hf --bf16 true\n")
    new = write_launch(read_launch([one], 8), {"offload_optimizer": "cpu"})[0].new_text
    assert new.startswith("accelerate launch --use_deepspeed --zero_stage 2 --offload_optimizer_device cpu train.py ")
    lines = write_text(tmp_path / "lines.sh", "accelerate launch --use_deepspeed --zero_stage 2 \\\n    train.py \\\n"
                                              "    --model_name_or_path meta-llama/Llama-2-7b-hf --bf16 true\n")
    new = write_launch(read_launch([lines], 8), {"offload_optimizer": "cpu"})[0].new_text
    assert new.split("\n")[:3] == ["accelerate launch --use_deepspeed --zero_stage 2 \\",
                                    "    --offload_optimizer_device cpu \\", "    train.py \\"]


@pytest.mark.parametrize("script, gpus", [("hf/torchrun_run_clm.sh", 4), ("hf/deepspeed_num_gpus.sh", 2)])
def test_hf_program_with_deepspeed_json(launches, tmp_path, script, gpus):
    words = shlex.split((launches / script).read_text().split("\n", 3)[-1].replace("\\\n", " "), comments=True)
    start = next(i for i, w in enumerate(words) if w.endswith(".py")) + 1
    flags = {}
    for w in words[start:]:
        if w.startswith("--"):
            key = w[2:]
            flags[key] = True
        else:
            flags[key] = {"true": True}.get(w, int(w) if w.isdigit() else w)
    known = {k: v for k, v in flags.items() if k not in ("model_name_or_path", "dataset_name", "dataset_config_name",
                                                         "block_size")}
    known["deepspeed"] = str(launches.parent / "examples/hf" / known["deepspeed"])
    rows = {"seq_len": flags["block_size"], "padding": "padded"} if "block_size" in flags else {}  # run_clm.py's own
    imported, notes = same_run(launches / script, [write(tmp_path, "args.json", known)], gpus,
                               model=flags["model_name_or_path"], **rows)
    assert imported.knobs["zero_stage"] == 2 and not imported.unread
    if "block_size" in flags:
        assert any("--block_size 1024 tokens" in n for n in notes)


def test_every_example_runs_through_the_cli(launches, capsys):
    for script in sorted(p for p in launches.rglob("*") if p.suffix in (".sh", ".txt")):
        assert main(["estimate", "--from", str(script), *GPU, "--json"]) == 0, capsys.readouterr().err
        assert json.loads(capsys.readouterr().out)


# --- several --from files ------------------------------------------------------------------------------------

def test_several_files_merge_and_a_disagreement_names_both(tmp_path, capsys):
    shutil.copytree(EX, tmp_path / "ex")
    acc = tmp_path / "ex/accelerate/deepspeed_zero3.yaml"
    args = tmp_path / "ex/hf/training_args.json"  # names ds_config_zero2.json: ZeRO-2
    code = main(["estimate", "llama3-8b", "--from", str(args), "--from", str(acc), *GPU])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "zero_stage" in err and "deepspeed_zero3.yaml says 3" in err
    assert "ds_config_zero2.json (named by training_args.json) says 2" in err
    recipe = tmp_path / "ex/hf/sft_config.yaml"
    merged = read_configs([recipe, acc], gpus=8)
    assert merged.knobs["zero_stage"] == 3 and merged.knobs["micro_batch"] == 2 and merged.world["num_gpus"] == 8
    assert main(["estimate", "--from", str(recipe), "--from", str(acc), *GPU, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any("8 GPUs as the file says" in str(a) for a in doc["assumptions"]), doc["assumptions"]


def test_a_stated_value_beats_another_files_default(tmp_path):
    ds = write(tmp_path, "ds.json", {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                                     "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}})
    args = write(tmp_path, "args.json", {"output_dir": "o", "bf16": True})  # batch left to TrainingArguments' 8
    merged = read_configs([args, ds])
    assert (merged.knobs["micro_batch"], merged.knobs["grad_accum"]) == (4, 2)
    assert merged.knobs["precision"] == "bf16-mixed"  # bf16 under DeepSpeed: fp32 master weights
    assert any("micro_batch=4 from ds.json" in n for n in merged.assumed)
    same_file = read_configs([args, args])
    assert same_file.knobs == read_config(args).knobs


def test_accelerate_mixed_precision_yields_to_the_training_arguments(tmp_path):
    acc = {**yaml.safe_load((EX / "accelerate/multi_gpu.yaml").read_text()), "mixed_precision": "fp16"}
    merged = read_configs([write(tmp_path, "acc.yaml", acc), EX / "hf/sft_config.yaml"])
    assert merged.knobs["precision"] == read_config(EX / "hf/sft_config.yaml").knobs["precision"]
    assert any("ACCELERATE_MIXED_PRECISION" in w for w in merged.warnings)


# --- GPU counts -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, gpus, nodes", [
    ("deepspeed --include localhost:0,1,2 train.py --per_device_train_batch_size 2", 3, 1),
    ("deepspeed --include 'h1:0,1@h2:0,1' train.py --per_device_train_batch_size 2", 4, 2),
    ("CUDA_VISIBLE_DEVICES=0,1 deepspeed train.py --per_device_train_batch_size 2", 2, 1),
    ("torchrun --nproc-per-node 4 --nnodes=2 train.py --per_device_train_batch_size 2", 8, 2),
    ("python -m torch.distributed.run --nproc_per_node=2 train.py --per_device_train_batch_size 2", 2, 1),
    ("accelerate launch --num_processes 6 --multi_gpu train.py --per_device_train_batch_size 2", 6, 1),
])
def test_gpu_count_from_the_launcher(tmp_path, line, gpus, nodes):
    script = tmp_path / "run.sh"
    script.write_text(f"{line} --model_name_or_path Qwen/Qwen2.5-0.5B\n")
    s, imported, _ = scenario([script])
    assert (s.hardware.gpus_per_node * s.hardware.nodes, s.hardware.nodes) == (gpus, nodes)
    assert s.micro_batch == 2


def test_typed_gpus_win_and_the_difference_is_noted(launches):
    s, _, notes = scenario([launches / "hf/torchrun_run_clm.sh"], gpus_per_node=2)
    assert s.hardware.world_size == 2
    assert any("the file says 4 GPUs, the command line 2" in n for n in notes)


# --- the shell ---------------------------------------------------------------------------------------------------

def test_variables_cd_comments_and_several_commands(tmp_path):
    (tmp_path / "cfg").mkdir()
    write(tmp_path / "cfg", "sft.yaml", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "max_length": 512})
    script = tmp_path / "run.sh"
    script.write_text('#!/bin/bash\nset -euxo pipefail\nexport BS=3\nSEQ=${SEQ:-1024}  # default\ncd cfg\n'
                      'echo "start $(date)" > log.txt\n'
                      'pip install -q trl && trl sft --config sft.yaml --per_device_train_batch_size $BS \\\n'
                      '  --max_length "${SEQ}" --output_dir \'$HOME/out\' 2>&1 | tee train.log\n'
                      'python merge.py\n')
    imported = read_config(script)
    assert (imported.knobs["micro_batch"], imported.knobs["seq_len"]) == (3, 1024)


ARRAY_LAUNCH = """#!/bin/bash
MODEL=Qwen/Qwen2.5-0.5B
# training arguments, one per line
ARGS=(
  --model_name_or_path "$MODEL"   # the base
  --per_device_train_batch_size 8
  --gradient_accumulation_steps 1
  --gradient_checkpointing True
)
ARGS+=(--max_length 2048)
NAME=("run $MODEL")
trl sft "${ARGS[@]}" --run_name "${NAME[0]}" --output_dir out
"""


def test_bash_arrays_expand_into_the_command(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(ARRAY_LAUNCH)
    k = read_config(script).knobs
    assert (k["micro_batch"], k["grad_accum"], k["checkpointing"], k["seq_len"]) == (8, 1, "full", 2048)


def test_fit_changes_a_flag_where_the_array_says_it(tmp_path):
    from memfit.interfaces.formats import launch_write
    from memfit.interfaces.formats.launch_sources import read_launch

    script = tmp_path / "run.sh"
    script.write_text(ARRAY_LAUNCH)
    launch = read_launch([script], None)
    files = launch_write.write(launch, {"micro_batch": 4, "grad_accum": 2, "seq_len": 1024})
    new = files[0].new_text
    assert "  --per_device_train_batch_size 4\n  --gradient_accumulation_steps 2\n" in new
    assert "ARGS+=(--max_length 1024)" in new and new.endswith('--run_name "${NAME[0]}" --output_dir out\n')
    again = launch_write.reread(launch, files, None).knobs
    assert (again["micro_batch"], again["grad_accum"], again["seq_len"]) == (4, 2, 1024)


@pytest.mark.parametrize("text, needle", [
    ("#!/bin/bash\necho nothing to train here\nls -l\n", "no training launch"),
    ("accelerate launch --config_file nope.yaml train.py --bf16\n", "nope.yaml: no such file"),
    ("torchrun --nproc_per_node 2 train.py --deepspeed missing_ds.json --bf16\n", "missing_ds.json: no such file"),
    ("llamafactory-cli train missing.yaml\n", "missing.yaml: no such file"),
    ("python train.py --output_dir 'unterminated --bf16\n", "unterminated ' quote"),
    ("ARGS=(\n  --bf16 true\ntrl sft \"${ARGS[@]}\"\n", "the array `ARGS=(` has no closing `)`"),
    ("llamafactory-cli train a.yaml\nllamafactory-cli train b.yaml\n", "2 training launches"),
    ("torchrun --nproc_per_node many train.py --bf16\n", "--nproc_per_node"),
    ("deepspeed --num_gpus\n", "--num_gpus: expects a value"),
    ("torchrun --nproc_per_node 2 train.py --per_device_train_batch_size $BS\n", "$BS"),
    ("python train.py --per_device_train_batch_size " + "9" * 5000 + "\n", "expected an integer"),
    ("python train.py --output_dir " + "x" * 100_001 + "\n", "not a launch script"),
])
def test_a_bad_launch_is_one_line_with_exit_2(tmp_path, capsys, text, needle):
    script = tmp_path / "run.sh"
    script.write_text(text)
    code = main(["estimate", "qwen2-7b", "--from", str(script), *GPU])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("memfit: error:") and needle.lower() in err.lower(), err


def test_openrlhf_commands_keep_their_reader(tmp_path, capsys):
    sft = EX / "openrlhf/train_sft_v0.11.sh"
    assert read_config(sft).format == "openrlhf"
    ppo = tmp_path / "ppo.sh"
    ppo.write_text("ray job submit -- python3 -m openrlhf.cli.train_ppo_ray --pretrain Qwen/Qwen2.5-7B "
                   "--micro_train_batch_size 2\n")
    assert main(["estimate", "--from", str(ppo), *GPU]) == 2  # OpenRLHF's reader: train_ppo_ray needs a reward
    assert "--reward_pretrain: the run has no reward" in capsys.readouterr().err


def test_fit_on_a_launch_writes_the_file_it_names(launches, capsys, monkeypatch, tmp_path):
    """The launch states nothing the plan changes: only its YAML is rewritten, under --out in the launch's layout
    beside copies of the launch's other files, so it runs from there (tests/plan/test_fit_launch.py covers every
    launch form)."""
    script = launches / "llamafactory_lora_sft_ds3.sh"
    capacity = cards.card(cards.from_file(str(script), gpu="rtx4090"), {"loss": "liger"})  # a key of the YAML
    code = main(["fit", str(script), "--gpu", "rtx4090", *cards.gpu_mem(capacity), "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 0
    yaml = "examples/llamafactory/examples/train_lora/llama3_lora_sft_ds3.yaml"
    assert [line for line in out.splitlines() if line.startswith("wrote ")] == [f"wrote {tmp_path / 'o' / yaml}"]
    written = sorted(str(p.relative_to(tmp_path / "o")) for p in (tmp_path / "o").rglob("*") if p.is_file())
    assert written == ["examples/llamafactory/examples/deepspeed/ds_z3_config.json", yaml,
                       "launch_examples/llamafactory_lora_sft_ds3.sh"]
    assert (tmp_path / "o" / written[0]).read_text() == (launches.parent / written[0]).read_text()  # a copy


def test_launcher_flag_tables_match_the_launchers():
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.run import get_args_parser

    from memfit.interfaces.formats.launch import ACCELERATE_BOOL, DEEPSPEED_BOOL, TORCHRUN_BOOL

    def switches(parser):
        return {s.lstrip("-").replace("-", "_") for a in parser._actions if a.option_strings and a.nargs == 0
                for s in a.option_strings}

    assert switches(launch_command_parser()) == ACCELERATE_BOOL
    assert switches(get_args_parser()) == TORCHRUN_BOOL
    import inspect

    import deepspeed.launcher.runner as runner

    source = inspect.getsource(runner.parse_args)
    found = {name for name in DEEPSPEED_BOOL if f'"--{name}"' in source or f'"-{name}"' in source}
    assert found == DEEPSPEED_BOOL
    assert source.count('action="store_true"') == len({"module", "no_python", "no_local_rank", "no_ssh", "no_ssh_check",
                                                       "force_multi", "save_pid", "bind_cores_to_rank", "quiet"})


# --- property: the order and quoting of flags do not matter -------------------------------------------------------

FLAGS = [("per_device_train_batch_size", "3"), ("gradient_accumulation_steps", "4"), ("gradient_checkpointing", None),
         ("bf16", None), ("max_length", "777"), ("use_peft", None), ("lora_r", "16"), ("learning_rate", "1e-5"),
         ("output_dir", "out dir/with space"), ("model_name_or_path", "Qwen/Qwen2.5-0.5B"), ("my_custom_flag", "x")]


def _spell(draw, key, value) -> list[str]:
    if value is None:
        return [draw(st.sampled_from([f"--{key}", shlex.quote(f"--{key}"), f"'--{key}'"]))]
    style = draw(st.integers(0, 3))
    if style == 0:
        return [f"--{key}={shlex.quote(value)}"]
    if style == 1:
        return [f"--{key}", shlex.quote(value)]
    if style == 2:
        return [f'"--{key}"', '"' + value.replace('"', '\\"') + '"']
    return [f"--{key}", "'" + value + "'"]


@st.composite
def launch_lines(draw):
    order = draw(st.permutations(FLAGS))
    words = [w for key, value in order for w in _spell(draw, key, value)]
    seps = [draw(st.sampled_from([" ", "  ", " \\\n  ", "\t"])) for _ in words]
    head = draw(st.sampled_from(["trl sft", "python train_sft.py", "accelerate launch --num_processes 2 train_sft.py",
                                 "torchrun --nproc_per_node 2 sft.py"]))
    return head + "".join(s + w for s, w in zip(seps, words)) + "\n", head


@settings(max_examples=60, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=launch_lines())
def test_flag_order_and_quoting_do_not_change_the_run(case, tmp_path_factory):
    text, head = case
    folder = tmp_path_factory.mktemp("order")
    script = folder / "run.sh"
    script.write_text(text)
    canonical = folder / "canonical.sh"
    canonical.write_text(head + " " + " ".join(f"--{k}" + (f" {shlex.quote(v)}" if v else "") for k, v in FLAGS) + "\n")
    got, want = read_config(script), read_config(canonical)
    assert got.knobs == want.knobs and got.world == want.world and got.model_name == want.model_name
    assert got.knobs["micro_batch"] == 3 and got.knobs["lora_rank"] == 16 and got.knobs["seq_len"] == 777
    assert any("--my_custom_flag" in w for w in got.warnings)


def test_a_command_line_given_as_text_resolves_from_here(monkeypatch):
    monkeypatch.chdir(EX / "hf")
    imported = read_config("deepspeed --include localhost:0,1,2 train.py --deepspeed ds_config_zero2.json "
                           "--per_device_train_batch_size 2 --bf16")
    assert imported.world["num_gpus"] == 3 and imported.knobs["zero_stage"] == 2 and imported.knobs["micro_batch"] == 2


def test_deepspeed_config_flag_names_a_deepspeed_json(tmp_path):
    shutil.copy(EX / "deepspeed/ds_config_explicit.json", tmp_path / "ds.json")
    (tmp_path / "run.sh").write_text("deepspeed --num_gpus 4 train.py --deepspeed --deepspeed_config ds.json\n")
    imported = read_config(tmp_path / "run.sh")
    assert imported.knobs == read_config(tmp_path / "ds.json", gpus=4).knobs
    assert imported.world["num_gpus"] == 4
