"""Inputs the fuzz (tests/fuzz/test_fuzz.py, bench/fuzz.py) found crashing or hanging, each now one error line."""
import json
from pathlib import Path

import pytest

from memfit.errors import MemfitError
from memfit.facts.catalog import find_model
from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import read_config

BASE = ["estimate", "qwen2-7b", "--gpu", "rtx4090", "--json"]
LLAMA = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 8, "intermediate_size": 1024, "vocab_size": 1000}


def one_error_line(argv, capsys, *needles) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memfit: error:"), err
    assert out == ""
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# --- command line ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["1e400", "9" * 400])
def test_whole_number_too_big_for_a_float(value, capsys):  # was OverflowError: cannot convert float infinity
    one_error_line(BASE + ["--seq", value], capsys, "--seq", "whole number")


def test_gpu_memory_too_big_for_a_float(capsys):  # was OverflowError in parse_size
    one_error_line(BASE + ["--gpu-mem", "9" * 400 + "GiB"], capsys, "not a size", "24GiB")


@pytest.mark.parametrize("flag, value", [("--method", ";"), ("--engine", "actor=1e400")])
def test_a_value_outside_the_choices_is_refused_before_the_profile_uses_it(flag, value, capsys):  # was KeyError
    one_error_line(BASE + [flag, value], capsys, flag, "choose one of")


def test_a_model_name_too_long_for_a_path(capsys):  # was OSError: File name too long
    one_error_line(["estimate", "x" * 300, "--gpu", "rtx4090"], capsys, "unknown model")


def test_a_line_break_in_an_argument_stays_on_the_error_line(capsys):
    line = one_error_line(["estimate", "qwen2\x0c7b\nx", "--gpu", "rtx4090"], capsys, "unknown model")
    assert "\\x0c" in line and "\\n" in line


def test_fit_out_folder_the_os_refuses(tmp_path, capsys):  # was OSError from writing the rewritten file
    src = Path(__file__).parents[1] / "formats" / "examples" / "openrlhf" / "train_sft_v0.11.sh"
    code = main(["fit", str(src), "--gpu", "h100", "--gpus", "1", "--out", str(tmp_path / ("x" * 300))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "File name too long" in err[0], err


# --- config.json -----------------------------------------------------------------------------------------

def config(tmp_path, text: str):
    (tmp_path / "config.json").write_text(text)
    return str(tmp_path)


@pytest.mark.parametrize("key, value, needle", [
    ("hidden_act", [], "hidden_act must be a string"),  # was TypeError: unhashable type: 'list'
    ("hidden_size", 10**400, "hidden_size must be an integer from 1"),  # was OverflowError in the estimate
    ("num_key_value_heads", 0, "num_kv_heads must be an integer from 1"),
    ("tie_word_embeddings", "yes", "tie_embeddings must be true or false"),
])
def test_config_json_value_of_the_wrong_type_or_range(tmp_path, key, value, needle):
    with pytest.raises(MemfitError, match=needle):
        find_model(config(tmp_path, json.dumps({**LLAMA, key: value})))


@pytest.mark.parametrize("text, needle", [
    ('{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}", "malformed config.json"),  # was ValueError
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # was RecursionError
], ids=["5000-digits", "deep"])
def test_config_json_that_python_refuses_to_parse(tmp_path, text, needle):
    with pytest.raises(MemfitError, match=needle):
        find_model(config(tmp_path, text))


def test_gptq_group_size_minus_one_still_reads_and_zero_is_refused(tmp_path):
    q = {"quant_method": "gptq", "bits": 4}
    assert find_model(config(tmp_path, json.dumps({**LLAMA, "quantization_config": {**q, "group_size": -1}}))
                      ).gptq_group_size == -1
    with pytest.raises(MemfitError, match="group_size must be -1 or a positive integer"):
        find_model(config(tmp_path, json.dumps({**LLAMA, "quantization_config": {**q, "group_size": 0}})))


# --- framework files -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, text, needle", [
    ("train.yaml", "a: " + "[" * 100_000 + "]" * 100_000, "nested too deeply"),  # was RecursionError
    ("ds.json", '{"train_batch_size": ' + "9" * 5000 + "}", "thousands of digits"),  # was ValueError
    ("train.yaml", "stage: sft\ncutoff_len: " + "9" * 5000 + "\n", "thousands of digits"),
    ("accelerate.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config: 7\n", "deepspeed_config: expected a mapping"),
    ("accelerate.yaml", "distributed_type: [FSDP]\n", "distributed_type: distributed type"),  # was unhashable list
    ("accelerate.yaml", "distributed_type: FSDP\nfsdp_config: {1: true}\n", "fsdp_config.1: not an accelerate"),
    ("accelerate.yaml", "distributed_type: FSDP\nfsdp_config: {fsdp_sharding_strategy: [1]}\n", "sharding strategy"),
    ("train.yaml", "stage: sft\ncutoff_len: .inf\n", "cutoff_len: expected an integer"),  # was OverflowError
    ("train.yaml", "stage: sft\ncutoff_len: '1e400'\n", "cutoff_len: expected an integer"),
    ("sft.yaml", "model_name_or_path: Qwen/Qwen2.5-7B-Instruct\nfsdp: 5\n", "fsdp: expected FSDP options"),
    ("sft.yaml", "\ufeff" + "[" * 100_000, "nested too deeply"),  # was 0.6 CPU s per parse (fit parses 4 times)
], ids=lambda v: v if len(str(v)) < 40 else f"{str(v)[:20]}...")
def test_framework_file_refused_in_one_line(tmp_path, name, text, needle):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(MemfitError, match=needle) as e:
        read_config(path)
    assert "\n" not in str(e.value)


def test_yaml_alias_bomb_is_not_expanded_into_the_error(tmp_path):
    # a 10^6-leaf value: its repr was a megabyte-long error line (10^9 leaves would not finish)
    levels = ["&l0 [" + ", ".join(["x"] * 10) + "]"]
    levels += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 6)]
    path = tmp_path / "accelerate.yaml"
    path.write_text(f"distributed_type: MULTI_GPU\nnum_processes: [{', '.join(levels)}]\n")
    with pytest.raises(MemfitError, match="num_processes: expected an integer") as e:
        read_config(path)
    assert len(str(e.value).split("got ", 1)[1]) <= 80


def test_an_integer_too_big_for_a_float_is_read_as_an_integer(tmp_path):  # was OverflowError: int too large
    from memfit.interfaces.formats.base import as_int

    assert as_int("ds.json", "train_batch_size", 10**400) == 10**400
    path = tmp_path / "ds.json"
    path.write_text('{"train_batch_size": 1' + "0" * 400
                    + ', "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}')
    with pytest.raises(MemfitError, match="train_batch_size"):
        read_config(path, gpus=8)


def test_a_float_key_of_400_digits_is_one_line(tmp_path, capsys):  # was OverflowError in formats/base.as_float
    path = tmp_path / "sft_config.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen2-7B\nmax_length: 2048\nlearning_rate: 1" + "0" * 400 + "\n")
    one_error_line(["estimate", "--from", str(path), "--gpu", "a100-80gb", "--json"], capsys, "learning_rate",
                   "expected a number")
