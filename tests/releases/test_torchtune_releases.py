"""--framework-version torchtune=VERSION: older recipes' defaults (data/releases.toml [package.torchtune]), read from
pytorch/torchtune's configs at each tag; without a version the profile is torchtune 0.6.1's."""
import re
import tomllib
from pathlib import Path

import pytest

from memfit.errors import MemfitError
from memfit.facts.catalog import find_gpu, find_model
from memfit.facts.frameworks import framework
from memfit.facts.profiles import build_scenario
from memfit.facts.releases import packages, parse_version, release_range
from memfit.facts.scenario import Hardware
from memfit.interfaces.cli.main import main
from memfit.roles.estimate import estimate

ROOT = Path(__file__).resolve().parents[2]
# Llama-2-7B, 4 x 2048 tokens on one RTX 4090: the README table of torchtune PR #955 (May 2024)
RUN = dict(micro_batch=4, seq_len=2048)
LOGITS = 4 * 2048 * 32000  # tokens x vocabulary
LAYERS, HIDDEN, FFN, RANK = 32, 4096, 11008, 8


def _run(version=None, **knobs):
    hw = Hardware(gpu=find_gpu("rtx4090"))
    versions = {"torchtune": version} if version else None
    return build_scenario(find_model("meta-llama/Llama-2-7b-hf"), hw, {**RUN, **knobs}, "torchtune", versions=versions)


@pytest.mark.parametrize("version, loss, optimizer, lora, qlora", [
    ("0.1.1", "standard", "adamw-foreach", ("q", "v"), ("q", "k", "v", "o", "gate", "up", "down")),
    ("0.2.1", "standard", "adamw-foreach", ("q", "v"), ("q", "k", "v", "o", "gate", "up", "down")),
    ("0.3.0", "chunked_output", "adamw-foreach", ("q", "v"), ("q", "k", "v", "o", "gate", "up", "down")),
    ("0.3.1", "chunked_output", "adamw-fused", ("q", "v"), ("q", "k", "v", "o", "gate", "up", "down")),
    ("0.6.1", "chunked_output", "adamw-fused", ("all-linear",), ("all-linear",)),
])
def test_each_release_range_sets_its_recipes_defaults(version, loss, optimizer, lora, qlora):
    s = _run(version, tuning="lora")
    assert (s.loss, s.optimizer, s.lora_targets) == (loss, optimizer, lora)
    assert _run(version, tuning="qlora").lora_targets == qlora
    assert _run(version, tuning="full").loss == loss  # the LoRA targets are the adapter configs' only


def test_release_defaults_are_named_and_a_knob_the_user_says_wins():
    s = _run("0.2.1", tuning="lora")
    assert "lora_targets=q,v (torchtune 0.2.1 default)" in s.assumed
    assert "loss=standard (torchtune 0.2.1 default)" in s.assumed
    assert not any("all-linear" in a for a in s.assumed)
    said = _run("0.2.1", tuning="lora", loss="chunked_output", lora_targets=("q", "k", "v"))
    assert (said.loss, said.lora_targets) == ("chunked_output", ("q", "k", "v"))


def test_old_recipes_cost_fp32_logits_and_adapt_fewer_modules_than_the_pinned_release():
    old, new = estimate(_run("0.2.1", tuning="lora")), estimate(_run(tuning="lora"))
    code = framework("torchtune").model_code
    assert old.allocated.peak.get("logits_loss") == LOGITS * code["standard_loss"][2]  # fp32 logits, their grads
    assert new.allocated.peak.get("logits_loss") < old.allocated.peak.get("logits_loss")
    assert old.trainable_params == LAYERS * 2 * RANK * (HIDDEN + HIDDEN)  # q_proj, v_proj only
    per_layer = 4 * RANK * 2 * HIDDEN + 2 * RANK * (HIDDEN + FFN) + RANK * (FFN + HIDDEN)
    assert new.trainable_params == LAYERS * per_layer  # all-linear
    assert old.device_total.peak.total > new.device_total.peak.total


def test_the_pinned_release_estimates_as_no_version():
    pinned = tomllib.loads((ROOT / "memfit/facts/data/versions.toml").read_text())["venv"]["torchtune"]
    with_pin, without = _run(pinned, tuning="lora"), _run(tuning="lora")
    assert estimate(with_pin).device_total.peak.total == estimate(without).device_total.peak.total
    assert release_range("torchtune", pinned) is packages()["torchtune"]["range"][-1]
    assert "defaults" not in packages()["torchtune"]["range"][-1]


def test_the_torchtune_pin_is_one_release_everywhere():
    pinned = tomllib.loads((ROOT / "memfit/facts/data/versions.toml").read_text())["venv"]["torchtune"]
    script = (ROOT / "tests/trace/setup_torchtune_venv.sh").read_text()
    assert re.search(r'TORCHTUNE="torchtune==([\d.]+)"', script).group(1) == pinned
    assert framework("torchtune").model_code["torchtune"] == pinned
    assert framework("torchtune").model_code["several_devices"]["torchtune"] == pinned


def test_a_nightly_of_main_falls_in_the_release_it_became():
    assert parse_version("torchtune", "0.2.0.dev20240509") == (0, 2, 0)
    assert _run("0.2.0.dev20240509", tuning="lora").loss == "standard"


@pytest.mark.parametrize("version", ["0.0.2", "0.7.0", "1.0"])
def test_a_release_outside_every_range_is_a_one_line_error(version):
    with pytest.raises(MemfitError) as e:
        _run(version)
    text = str(e.value)
    assert "known ranges: [0.1.0, 0.3.0)" in text and "\n" not in text


def test_cli_refuses_an_unread_torchtune_release(capsys):
    args = ["estimate", "meta-llama/Llama-2-7b-hf", "--gpu", "rtx4090", "--profile", "torchtune", "--tuning", "lora"]
    assert main([*args, "--framework-version", "torchtune=0.2.1"]) == 0
    assert "lora_targets=q,v (torchtune 0.2.1 default)" in " ".join(capsys.readouterr().out.split())
    assert main([*args, "--framework-version", "torchtune=0.7"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memfit: error: --framework-version torchtune=0.7") and "\n" not in err
