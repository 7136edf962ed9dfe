"""LoRA over an 8-bit (LLM.int8) base: read from each format's own key, estimated between a 16-bit and a 4-bit
base (int8 weights; each int8 Linear keeps its input, which a 4-bit Linear does not), written back."""
import pytest

from memfit.errors import MemfitError
from memfit.facts.catalog import find_gpu, find_model
from memfit.facts.profiles import build_scenario
from memfit.facts.scenario import Hardware
from memfit.interfaces.formats import read_config, write_config_files
from memfit.roles.estimate import estimate

LF = """model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
quantization_bit: 8
stage: sft
do_train: true
finetuning_type: lora
lora_target: all
cutoff_len: 1024
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
bf16: true
"""
TRL = """model_name_or_path: meta-llama/Meta-Llama-3-8B
use_peft: true
load_in_8bit: true
lora_r: 16
max_length: 1024
per_device_train_batch_size: 1
bf16: true
"""


@pytest.mark.parametrize("text, fmt", [(LF, "llamafactory"), (TRL, "hf")])
def test_an_8bit_base_reads_as_qlora_with_8_bits(text, fmt):
    k = read_config(text, format=fmt).knobs
    assert (k["tuning"], k["quant_bits"]) == ("qlora", 8)


def test_both_4_and_8_bit_loading_is_one_line():
    with pytest.raises(MemfitError, match="choose one") as err:
        read_config(TRL.replace("load_in_8bit: true", "load_in_8bit: true\nload_in_4bit: true"), format="hf")
    assert "\n" not in str(err.value)


def test_llamafactory_writes_the_bits_back(tmp_path):
    path = tmp_path / "lora_8bit.yaml"
    path.write_text(LF)
    imported = read_config(path)
    (written,) = write_config_files(imported, {**imported.knobs, "quant_bits": 4})
    assert "quantization_bit: 4" in written.new_text
    assert read_config(written.new_text, format="llamafactory").knobs["quant_bits"] == 4


def _run(**knobs):
    hw = Hardware(gpu=find_gpu("a100-80gb"))
    s = build_scenario(find_model("meta-llama/Llama-3.1-8B"), hw, {"seq_len": 2048, "micro_batch": 2,
                                                                    "checkpointing": "off", **knobs}, "hf-trainer")
    return estimate(s).allocated.peak


def test_an_8bit_base_sits_between_a_16bit_and_a_4bit_one():
    lora, int8, nf4 = _run(tuning="lora"), _run(tuning="qlora", quant_bits=8), _run(tuning="qlora")
    assert nf4.get("weights") < int8.get("weights") < lora.get("weights")
    assert int8.get("activations") > nf4.get("activations")  # every int8 Linear keeps its input


def test_double_quant_on_an_8bit_base_is_refused():
    with pytest.raises(MemfitError, match="4-bit") as err:
        build_scenario(find_model("meta-llama/Llama-3.1-8B"), Hardware(gpu=find_gpu("a100-80gb")),
                       {"tuning": "qlora", "quant_bits": 8, "double_quant": False}, "hf-trainer",
                       typed=("double_quant",))
    assert "\n" not in str(err.value)
