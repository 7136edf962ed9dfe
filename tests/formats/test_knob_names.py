"""The formats speak the knob table: importers return only table knobs, each format says exactly the knobs the
table's `says` column gives it, and the keys the format code uses are the ones the table documents."""
import pytest

from format_cases import CASES, EXAMPLES
from memfit.errors import MemfitError
from memfit.facts.knobs import knobs
from memfit.interfaces.formats import exportable, read_config, write_config_files
from memfit.interfaces.formats import deepspeed, llamafactory, openrlhf_command


@pytest.mark.parametrize("name", sorted(CASES))
def test_importers_return_only_table_knobs(name):
    options, _ = CASES[name]
    imported = read_config(EXAMPLES / name, **options)
    for config in (imported, *imported.companions.values()):
        assert set(config.knobs) <= set(knobs()), set(config.knobs) - set(knobs())


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_change_a_format_writes_is_one_it_says(name):
    options, changes = CASES[name]
    imported = read_config(EXAMPLES / name, **options)
    assert set(changes) <= exportable(imported.format), set(changes) - exportable(imported.format)


@pytest.mark.parametrize("name", ["deepspeed/ds_config_explicit.json",
                                  "llamafactory/examples/train_lora/llama3_lora_sft.yaml",
                                  "openrlhf/train_sft_v0.11.sh", "accelerate/deepspeed_zero3.yaml",
                                  "hf/sft_config.yaml"])
def test_a_knob_the_format_does_not_say_is_refused_in_one_line(name):
    options, _ = CASES[name]
    imported = read_config(EXAMPLES / name, **options)
    unsaid = next(k for k in ("optimizer_in_backward", "seq_len", "ratio") if k not in exportable(imported.format))
    value = {"optimizer_in_backward": True, "seq_len": 4096, "ratio": 0.5}[unsaid]
    with pytest.raises(MemfitError) as error:
        write_config_files(imported, {unsaid: value})
    assert "\n" not in str(error.value) and unsaid in str(error.value)


def test_the_table_documents_the_keys_the_format_code_uses():
    says = {name: k.says for name, k in knobs().items()}
    for name, (legacy, dotted) in openrlhf_command.FLAGS.items():
        if name in says:
            assert legacy in says[name]["openrlhf"] and dotted in says[name]["openrlhf"], name
    for name, key in llamafactory.SAME_VALUE_KEYS.items():
        assert key in says[name]["llamafactory"], name
    for name, keys in deepspeed.ZERO_KEYS.items():
        assert keys[0] in says[name]["deepspeed"], name
