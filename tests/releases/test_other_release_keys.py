"""A key another TRL release's parser accepted is a warning naming that release, not a refusal (issue 12 item 2,
keys); tables/hf_other_releases.json "keys" is written by tools/trl_release_keys.py from TRL's tags."""
import re

import pytest

from memfit.errors import MemfitError
from memfit.interfaces.formats import read_config
from memfit.interfaces.formats.tables import table

DPO = "model_name_or_path: Qwen/Qwen2-7B\nmax_length: 2048\nper_device_train_batch_size: 1\nbeta: 0.1\n"


def test_an_older_dpo_key_that_looks_like_a_memory_setting_is_a_warning_naming_its_releases(tmp_path):
    path = tmp_path / "dpo.yaml"
    path.write_text(DPO + "max_prompt_length: 1024\nuse_num_logits_to_keep: true\n")
    warnings = " ".join(read_config(path).warnings)
    assert "max_prompt_length: a key of TRL 0.9" in warnings
    assert "use_num_logits_to_keep: a key of TRL 0.13" in warnings


def test_a_memory_looking_key_no_release_accepted_is_still_refused(tmp_path):
    path = tmp_path / "dpo.yaml"
    path.write_text(DPO + "max_promt_length: 1024\n")
    with pytest.raises(MemfitError, match="looks like a memory setting"):
        read_config(path)


def test_other_release_keys_are_not_keys_of_the_pinned_tables_and_name_trl_releases():
    t, other = table("hf"), table("hf_other_releases")
    now = {"sft": set(t["SFTConfig"]) | set(t["ModelConfig"]), "dpo": set(t["DPOConfig"]) | set(t["ModelConfig"])}
    for variant, keys in other["keys"].items():
        assert keys and not set(keys) & now[variant]
        assert all(re.fullmatch(r"TRL \d+\.\d+\.\d+( \.\. \d+\.\d+\.\d+)?", span) for span in keys.values())
