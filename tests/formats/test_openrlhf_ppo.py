"""OpenRLHF train_ppo_ray commands (issue 12 item 1): read onto memfit's role knobs, checked against each release's
own argparse parser (rebuilt from the released wheels, as test_validate.py does for train_sft / train_dpo)."""
import json
from pathlib import Path

import pytest

import cards
from memfit.errors import MemfitError
from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import read_config, write_config_files
from memfit.interfaces.formats import openrlhf as orl
from memfit.interfaces.formats import validate_openrlhf
from memfit.interfaces.formats.openrlhf_command import flag_name, flags_of
from memfit.interfaces.formats.tables import table

HERE = Path(__file__).parent / "openrlhf_ppo_examples"
EXAMPLES = sorted(p.name for p in HERE.glob("*.sh"))
SCRIPT = "train_ppo_ray"


@pytest.fixture(scope="module")
def wheels():
    try:
        for version in validate_openrlhf.OPENRLHF_VERSIONS:
            validate_openrlhf.openrlhf_source(version, SCRIPT)
    except Exception as e:  # no network to the package index
        pytest.skip(f"cannot fetch the OpenRLHF wheels: {e}")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the examples name hub models memfit must not look up


def _parsed(imported) -> dict:
    """The command's arguments as the release's own parser reads them (dest -> value)."""
    args = validate_openrlhf.validate_openrlhf(orl.arguments(imported), imported.variant, SCRIPT)
    return vars(args)


def _arg(args: dict, version: str, name: str):
    return args[flags_of(version, SCRIPT)[flag_name(version, SCRIPT, name)]["dest"]]


def test_at_least_three_examples_name_their_source():
    assert len(EXAMPLES) >= 3
    for name in EXAMPLES:
        head = (HERE / name).read_text().split("python3 -m")[0]
        assert "github.com/OpenRLHF/OpenRLHF" in head and "examples/scripts/" in head and "commit" in head, name


def test_the_stored_table_is_each_releases_train_ppo_ray_parser(wheels):
    stored = table("openrlhf")["versions"]
    for version in validate_openrlhf.OPENRLHF_VERSIONS:
        derived = validate_openrlhf.argparse_table(validate_openrlhf.openrlhf_source(version, SCRIPT))
        assert json.loads(json.dumps(derived)) == stored[version][SCRIPT], version
    # >= 0.10.2 declares the actor's and critic's optimizer flags in a loop: both are there
    assert {"--actor.adam.lr", "--critic.adam.lr"} <= set(stored["0.11.2"][SCRIPT])


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_releases_parser_accepts_each_example_and_agrees_with_memfit(name, wheels):
    imported = read_config(HERE / name)
    version, k = imported.variant, imported.knobs
    args = _parsed(imported)
    arg = lambda n: _arg(args, version, n)  # noqa: E731
    assert k["zero_stage"] == arg("zero_stage")
    assert (k["offload_optimizer"] == "cpu") == arg("adam_offload")
    assert k["checkpointing"] == ("full" if arg("checkpointing") else "off")
    assert k["method"] == ("ppo" if arg("estimator") == "gae" else "grpo")
    assert k["init_kl_coef"] == arg("init_kl_coef")
    assert k["vllm_engines"] == (arg("vllm_engines") or 0) and k["vllm_tp"] == arg("vllm_tp")
    assert k["vllm_gpu_memory_utilization"] == arg("vllm_gpu_memory_utilization")
    colocate_all = arg("colocate_all")
    assert (k["colocate"] == "all") == colocate_all
    assert k["vllm_sleep"] == (arg("vllm_sleep") and colocate_all)  # the script's own rule
    assert k["deepspeed_sleep"] == arg("deepspeed_sleep")
    assert k["remote_reward"] == bool(arg("remote_reward") or arg("agent"))
    for role, gpus in k["role_gpus"]:
        assert gpus == arg(f"{role}_num_nodes") * arg(f"{role}_num_gpus_per_node")
    roles = {r for r, _ in k["role_gpus"]}
    assert ("critic" in roles) == (arg("estimator") == "gae")
    assert ("ref" in roles) == (arg("init_kl_coef") > 0)
    if version in ("0.8.9", "0.9.1") and not arg("seq_len"):
        assert k["seq_len"] == arg("prompt_max_len") + arg("generate_max_len")
    else:
        assert k["seq_len"] == arg("seq_len")
    if not arg("dynamic_batch"):
        assert k["micro_batch"] == arg("micro_batch")
        assert k["rollout_micro_batch"] == arg("rollout_micro_batch")
    else:  # a token budget per micro-step, read as whole packed rows reaching it
        assert (k["micro_batch"] - 1) * k["seq_len"] < arg("train_max_tokens") <= k["micro_batch"] * k["seq_len"]
    assert k["padding"] == ("padding_free" if arg("packing") or arg("dynamic_batch") else "padded")


@pytest.mark.parametrize("name", EXAMPLES)
def test_unchanged_knobs_write_the_same_bytes(name):
    imported = read_config(HERE / name)
    files = write_config_files(imported, dict(imported.knobs))
    assert files[0].new_text == files[0].old_text


def test_a_deepspeed_flag_is_rewritten_and_the_release_parses_it(tmp_path, wheels):
    path = tmp_path / "ppo.sh"
    path.write_text((HERE / "ppo_llama3_8b_split_gpus_v0.11.sh").read_text())
    imported = read_config(path)
    files = write_config_files(imported, {**imported.knobs, "zero_stage": 2})
    path.write_text(files[0].new_text)
    again = read_config(path)
    assert again.knobs["zero_stage"] == 2 and _parsed(again)["ds.zero_stage"] == 2
    assert {k: v for k, v in again.knobs.items() if k not in ("zero_stage", "overlap_comm")} == \
           {k: v for k, v in imported.knobs.items() if k not in ("zero_stage", "overlap_comm")}


def test_the_runs_shape_is_not_rewritten():
    imported = read_config(HERE / "ppo_llama3_8b_split_gpus_v0.11.sh")
    for knob, value in (("colocate", "all"), ("vllm_engines", 2), ("role_gpus", (("actor", 8),))):
        with pytest.raises(MemfitError, match="keeps train_ppo_ray's roles"):
            write_config_files(imported, {**imported.knobs, knob: value})


@pytest.mark.parametrize("knob, value, flag", [("vllm_gpu_memory_utilization", 0.5, "--vllm.gpu_memory_utilization"),
                                               ("reward_offload", None, "--reward.offload"),
                                               ("vllm_sleep", None, "--vllm.enable_sleep"),
                                               ("deepspeed_sleep", None, "--ds.enable_sleep")])
def test_the_role_knobs_the_planner_changes_are_written_and_read_back(knob, value, flag, wheels):
    imported = read_config(HERE / "prorl_r1_distill_1.5b_v0.11.sh")
    value = not imported.knobs[knob] if value is None else value  # a switch: the other way
    assert imported.knobs[knob] != value
    text = write_config_files(imported, {**imported.knobs, knob: value})[0].new_text
    again = read_config(text, format="openrlhf")
    assert (flag in text) == (value is not False) and again.knobs[knob] == value
    assert {k: v for k, v in again.knobs.items() if k != knob} == {k: v for k, v in imported.knobs.items() if k != knob}
    _parsed(again)  # the release's own parser takes it


def test_before_0_10_2_reference_and_reward_offload_together():
    imported = read_config(HERE / "ppo_llama3_8b_colocate_all_v0.9.sh")  # a reference (kl 0.01) and a reward model
    with pytest.raises(MemfitError, match="offloads the reference and the reward model together"):
        write_config_files(imported, {**imported.knobs, "ref_offload": True})
    text = write_config_files(imported, {**imported.knobs, "ref_offload": True, "reward_offload": True})[0].new_text
    again = read_config(text, format="openrlhf")
    assert "--ref_reward_offload" in text and again.knobs["ref_offload"] and again.knobs["reward_offload"]


def test_a_dynamic_batch_micro_batch_is_written_as_its_token_budget(wheels):
    imported = read_config(HERE / "prorl_r1_distill_1.5b_v0.11.sh")
    k = imported.knobs
    rows = k["micro_batch"] * k["grad_accum"]
    text = write_config_files(imported, {**k, "micro_batch": 2, "grad_accum": rows // 2})[0].new_text
    again = read_config(text, format="openrlhf")
    args = _parsed(again)
    assert _arg(args, again.variant, "train_max_tokens") == 2 * k["seq_len"]
    assert again.knobs["micro_batch"] == 2 and again.knobs["grad_accum"] == rows // 2
    # the rollout keeps the budget it had (the training one, by default) and the global batch stays
    assert again.knobs["rollout_micro_batch"] == k["rollout_micro_batch"]
    assert _arg(args, again.variant, "global_batch") == _arg(_parsed(imported), imported.variant, "global_batch")


MODELS = {"model": "llama-3-8b", "reward_model": "llama-3-8b", "critic_model": "llama-3-8b"}


def _fit(capsys, tmp_path, name: str, hardware: list[str]) -> tuple[int, str]:
    models = [w for knob, m in MODELS.items() for w in (f"--{knob.replace('_', '-')}", m)]  # --reward-model ...
    code = main(["fit", str(HERE / name), *models, *hardware, "--out", str(tmp_path)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _one_row(run) -> dict:
    """Micro-batch 1, the accumulation holding the step's rows."""
    return {"micro_batch": 1, "grad_accum": run.micro_batch * run.grad_accum}


# (example, its GPU, a change the command can say): the card is the GPU itself where a plan fits there (None), else
# one of its kind derived from memfit's own verdict (tests/cards.py), the smallest on which the change fits and the
# example as written does not, so each row keeps its meaning as the error bands move
FITS = [("dapo_llama3_8b_v0.10.sh", "a100-40gb", _one_row), ("ppo_llama3_8b_colocate_all_v0.9.sh", "a100-40gb", None),
        # its own vLLM group takes 0.95 of any card (the default), too little room for the band on any card
        ("ppo_llama3_8b_split_gpus_v0.11.sh", "l40s", lambda run: {"vllm_gpu_memory_utilization": 0.4}),
        ("prorl_r1_distill_1.5b_v0.11.sh", "l40s", _one_row),
        ("reinforce_baseline_llama3_8b_v0.9.sh", "a100-40gb", None)]


def _hardware(name: str, gpu: str, change) -> list[str]:
    if change is None:
        return ["--gpu", gpu]
    run = cards.from_file(str(HERE / name), gpu=gpu, **MODELS)
    return ["--gpu", gpu, *cards.gpu_mem(cards.card(run, change(run)))]


@pytest.mark.parametrize("name, gpu, change", FITS, ids=[f"{n}-{g}" for n, g, _ in FITS])
def test_fit_rewrites_each_example_keeping_its_shape_and_data(name, gpu, change, tmp_path, capsys, wheels):
    code, out = _fit(capsys, tmp_path, name, _hardware(name, gpu, change))
    assert code == 0 and "-> fits" in out, out
    before, after = read_config(HERE / name), read_config(tmp_path / name)
    assert after.text != before.text
    for knob in ("colocate", "vllm_engines", "vllm_tp", "role_gpus", "seq_len", "padding", "method", "init_kl_coef"):
        assert after.knobs[knob] == before.knobs[knob], knob
    args, old = _parsed(after), _parsed(before)
    for name_ in ("global_batch", "rollout_micro_batch"):  # the step's data: samples per update, per rollout batch
        assert _arg(args, after.variant, name_) == _arg(old, before.variant, name_), name_


def test_fit_names_the_role_model_it_cannot_resolve(capsys, tmp_path):
    code = main(["fit", str(HERE / "ppo_llama3_8b_colocate_all_v0.9.sh"), "--model", "llama-3-8b", "--gpu", "l40s",
                 "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "Llama-3-8b-rm-700k" in err and "--reward-model" in err and "global batch" not in err


# --- the script's own rules after parsing ---------------------------------------------------------------------

BASE = ("python3 -m openrlhf.cli.train_ppo_ray --actor.model_name_or_path m --actor.num_gpus_per_node 4 "
        "--vllm.num_engines 4 --ds.zero_stage 3 ")


def _read(text: str):
    return read_config(text, format="openrlhf")


def test_estimators_other_than_gae_drop_the_critic():
    for estimator, method in (("gae", "ppo"), ("reinforce", "grpo"), ("rloo", "grpo"), ("dr_grpo", "grpo")):
        k = _read(BASE + f"--reward.model_name_or_path r --algo.advantage.estimator {estimator}").knobs
        assert k["method"] == method
        assert ("critic" in dict(k["role_gpus"])) == (estimator == "gae")


def test_vllm_sleep_needs_colocate_all():
    off = _read(BASE + "--reward.remote_url f.py --vllm.enable_sleep")
    assert off.knobs["vllm_sleep"] is False and any("--vllm.enable_sleep" in w for w in off.warnings)
    on = _read(BASE + "--reward.remote_url f.py --vllm.enable_sleep --train.colocate_all --ref.num_gpus_per_node 4 "
                "--critic.num_gpus_per_node 4")
    assert on.knobs["vllm_sleep"] is True and on.world["num_gpus"] == 4


def test_separate_groups_add_up_and_a_remote_reward_has_no_model():
    imported = _read(BASE + "--reward.remote_url f.py --ref.num_gpus_per_node 2 --algo.advantage.estimator group_norm")
    assert dict(imported.knobs["role_gpus"]) == {"actor": 4, "ref": 2}
    assert imported.world["num_gpus"] == 4 + 2 + 4  # actor, reference, 4 engines x TP 1
    assert "reward_model" not in imported.knobs and imported.knobs["remote_reward"] is True


def test_legacy_sequence_is_prompt_plus_generation_unless_max_len_is_given():
    legacy = ("python3 -m openrlhf.cli.train_ppo_ray --pretrain m --reward_pretrain r --vllm_num_engines 8 --bf16 "
              "--attn_implementation flash_attention_2 --prompt_max_len 512 --generate_max_len 3000")
    assert _read(legacy).knobs["seq_len"] == 3512
    assert _read(legacy + " --max_len 1000").knobs["seq_len"] == 1000


def test_no_reward_and_mismatched_colocation_are_one_line_errors():
    with pytest.raises(MemfitError, match="no reward") as e:
        _read(BASE)
    assert "\n" not in str(e.value)
    with pytest.raises(MemfitError, match="same GPUs"):
        _read(BASE + "--reward.remote_url f.py --train.colocate_actor_ref --ref.num_gpus_per_node 2")
    with pytest.raises(MemfitError, match="did you mean"):
        _read(BASE + "--reward.remote_url f.py --vllm.gpu_memory_utilisation 0.5")


# --- flags named as not modelled ----------------------------------------------------------------------------------

def _entries():
    return [(names, flag) for names in table("not_modelled")["openrlhf_ppo"] if not names.startswith("_")
            for flag in names.split(" | ")]


@pytest.mark.parametrize("names, flag", _entries())
def test_each_not_modelled_flag_is_a_real_flag_named_when_set(names, flag):
    version = "0.11.2" if flag.count(".") else "0.10.1"
    spec = flags_of(version, SCRIPT).get(flag)
    assert spec is not None, f"{flag} is no flag of OpenRLHF {version} train_ppo_ray"
    value = "" if spec.get("action") == "store_true" else {"int": " 2", "float": " 0.5"}.get(spec.get("type"), " x")
    text = BASE + "--reward.remote_url f.py --algo.advantage.estimator group_norm "
    if version == "0.10.1":
        text = ("python3 -m openrlhf.cli.train_ppo_ray --pretrain m --remote_rm_url f.py --vllm_num_engines 8 "
                "--advantage_estimator group_norm ")
    named = [w for w in _read(text + flag + value).warnings if f"{flag}=" in w and "not modelled" in w]
    assert len(named) == 1 and ("too high" in named[0] or "too low" in named[0].lower()), named


# --- estimates from the examples --------------------------------------------------------------------------------

def _estimate(capsys, path, *extra) -> dict:
    code = main(["estimate", "--from-file", str(path), "--gpu", "h100", "--json", *extra])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_lower_vllm_memory_lowers_the_colocated_peak(tmp_path, capsys):
    text = (HERE / "dapo_llama3_8b_v0.10.sh").read_text()
    low = tmp_path / "low.sh"
    low.write_text(text.replace("--vllm_gpu_memory_utilization 0.6", "--vllm_gpu_memory_utilization 0.3"))
    assert low.read_text() != text
    high, lower = (_estimate(capsys, p, "llama-3-8b") for p in (HERE / "dapo_llama3_8b_v0.10.sh", low))
    assert high["method"] == "grpo" and high["gpus_needed"] == 8
    assert lower["gpu_groups"][0]["peak_bytes"] < high["gpu_groups"][0]["peak_bytes"]


def test_split_placement_estimates_each_group(capsys):
    d = _estimate(capsys, HERE / "ppo_llama3_8b_split_gpus_v0.11.sh", "llama-3-8b", "--reward-model", "llama-3-8b")
    groups = {g["name"]: g["gpus"] for g in d["gpu_groups"]}
    assert groups == {"actor+ref": 4, "critic+reward": 4, "vllm": 8} and d["gpus_needed"] == 16


def test_a_ppo_command_needs_its_reward_model_resolvable(capsys):
    code = main(["estimate", "--from-file", str(HERE / "ppo_llama3_8b_colocate_all_v0.9.sh"), "--gpu", "h100",
                 "llama-3-8b"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("memfit: error:") and "Llama-3-8b-rm-700k" in err
