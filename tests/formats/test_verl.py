"""verl launches (issue 33 items 3 and 4): `python3 -m verl.trainer.main_ppo key=value ...` read onto memfit's knobs
as Hydra composes verl 0.9.1's ppo_trainer config, and written back by editing only the overrides a fit changes.
verl's own composition of the same launches is in test_verl_venv.py (its venv); the examples are verl's own
(tests/formats/verl_examples/, each with its source line)."""
import re
from pathlib import Path

import pytest

import cards
from memfit.errors import MemfitError
from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import detect_format, read_config, write_config_files
from memfit.interfaces.formats.verl_command import find_launch

EXAMPLES = Path(__file__).resolve().parent / "verl_examples"
A = "actor_rollout_ref."
BASE = (f"python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo {A}rollout.name=vllm "
        f"{A}model.path=Qwen/Qwen2.5-7B-Instruct {A}actor.ppo_micro_batch_size_per_gpu=4 ")


def _words(path: Path) -> dict:
    """key -> value text of the launch's overrides, as the script's shell hands them to verl."""
    launch = find_launch(path.read_text(), str(path), path.parent)
    return dict(w.lstrip("+").split("=", 1) for w in launch.words if "=" in w)


@pytest.mark.parametrize("name", ["run_qwen2-7b.sh", "run_qwen3_8b_fsdp.sh", "run_seed_oss_36b_fsdp.sh",
                                  "run_mistral_nemo_12b_skyworkrm_fsdp.sh"])
def test_the_example_reads_as_its_overrides_say(name):
    path = EXAMPLES / name
    words, imported = _words(path), read_config(path)
    k = imported.knobs
    assert detect_format(path.read_text(), name) == "verl" and imported.profile == "verl"
    assert k["seq_len"] == int(words["data.max_prompt_length"]) + int(words["data.max_response_length"])
    assert k["vllm_gpu_memory_utilization"] == float(words[A + "rollout.gpu_memory_utilization"])
    assert k["vllm_tp"] == int(words[A + "rollout.tensor_model_parallel_size"])
    assert k["method"] == ("ppo" if words["algorithm.adv_estimator"] == "gae" else "grpo")
    assert (k["init_kl_coef"] > 0) == (words.get(A + "actor.use_kl_loss") == "True")
    assert imported.world["num_gpus"] == int(words["trainer.n_gpus_per_node"]) * int(words["trainer.nnodes"])
    assert k["param_offload"] == (words.get(A + "actor.fsdp_config.param_offload") == "True")
    assert k["ref_offload"] == (words.get(A + "ref.fsdp_config.param_offload") == "True")
    assert imported.model_name == words[A + "model.path"]
    if words.get(A + "actor.use_dynamic_bsz") == "True":  # a token budget read as whole rows, rounded up
        budget = int(words.get(A + "actor.ppo_max_token_len_per_gpu", 16384))
        assert (k["micro_batch"] - 1) * k["seq_len"] < budget and k["dynamic_bsz"]
        assert k["ppo_max_token_len"] == budget
    else:
        assert k["micro_batch"] == int(words[A + "actor.ppo_micro_batch_size_per_gpu"])
    roles = dict(k["role_gpus"])
    assert ("critic" in roles) == (k["method"] == "ppo") and ("reward" in roles) == (not k["remote_reward"])


def test_an_unknown_key_is_one_line_naming_the_nearest():
    for typo, nearest in ((f"{A}actor.fsdp_config.param_ofload=True", f"{A}actor.fsdp_config.param_offload"),
                          ("critic.model.fsdp_config.param_offload=False", "critic.fsdp.param_offload")):
        with pytest.raises(MemfitError) as e:
            read_config(BASE + typo)
        message = str(e.value)
        assert "\n" not in message and typo.split("=")[0] in message and nearest in message


def test_hydra_prefixes_as_hydra_reads_them():
    with pytest.raises(MemfitError, match="already has trainer.nnodes"):
        read_config(BASE + "+trainer.nnodes=2")
    assert read_config(BASE + "++trainer.nnodes=2").world["num_gpus"] == 16
    assert read_config(BASE + "+ray_kwargs.ray_init.num_gpus=8").knobs["micro_batch"] == 4  # a new key: accepted
    with pytest.raises(MemfitError, match="cannot delete"):
        read_config(BASE + "~trainer.no_such_key")
    with pytest.raises(MemfitError, match="not a Hydra override"):
        read_config(BASE + "trainer.nnodes")


def test_interpolations_follow_the_keys_they_name():
    """The log-prob token budgets default to the actor's (${oc.select:...ppo_max_token_len_per_gpu,16384})."""
    run = BASE + f"{A}actor.use_dynamic_bsz=True {A}actor.ppo_max_token_len_per_gpu=3000 data.max_prompt_length=500 " \
                 f"data.max_response_length=500 {A}rollout.log_prob_use_dynamic_bsz=True"
    k = read_config(run).knobs
    assert k["log_prob_max_token_len"] == 3000 and k["rollout_micro_batch"] == 3 and k["micro_batch"] == 3
    k = read_config(run + f" {A}ref.log_prob_max_token_len_per_gpu=8000 {A}ref.log_prob_use_dynamic_bsz=True").knobs
    assert k["log_prob_max_token_len"] == 8000 and k["rollout_micro_batch"] == 8


def test_unmodelled_memory_keys_are_named_and_cap_the_verdict():
    raising = {f"{A}rollout.max_num_batched_tokens=16384", f"{A}rollout.enable_chunked_prefill=False",
               f"{A}actor.strategy=megatron", f"{A}rollout.name=sglang"}
    imported = read_config(BASE + " ".join(sorted(raising)) + f" {A}actor.ulysses_sequence_parallel_size=2")
    for word in raising:
        key = word.split("=")[0]
        assert any(key in u for u in imported.unread), key
    # Ulysses lowers memory: named, never a cap
    assert not any("ulysses" in u for u in imported.unread)
    assert any("ulysses_sequence_parallel_size=2" in w and "too high" in w for w in imported.warnings)
    assert not read_config(BASE).unread


def test_the_legacy_reward_model_keys_are_named_as_unread_by_verl():
    imported = read_config(BASE + "reward_model.enable=True reward_model.model.path=Skywork/RM")
    assert imported.knobs["remote_reward"] and any("legacy reward_model" in w for w in imported.warnings)


CHANGES = {"run_qwen2-7b.sh": {"param_offload": True, "optimizer_offload": True, "micro_batch": 20, "grad_accum": 8,
                               "vllm_gpu_memory_utilization": 0.5, "rollout_micro_batch": 16, "checkpointing": "off"},
           "run_qwen3_8b_fsdp.sh": {"micro_batch": 4, "grad_accum": 8, "critic_optimizer_offload": True,
                                    "vllm_sleep": False, "rollout_micro_batch": 4, "ref_offload": False},
           "run_seed_oss_36b_fsdp.sh": {"param_offload": False, "entropy_chunking": True, "entropy_checkpointing": True},
           "run_mistral_nemo_12b_skyworkrm_fsdp.sh": {"optimizer_offload": True, "micro_batch": 5, "grad_accum": 16}}


def rewritten(name: str) -> tuple[str, str, dict]:
    """(the example's text, its text as memfit writes CHANGES[name], the changes)."""
    imported = read_config(EXAMPLES / name)
    return imported.text, write_config_files(imported, {**imported.knobs, **CHANGES[name]})[0].new_text, CHANGES[name]


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_the_writer_edits_only_the_overrides_it_changes(name):
    old, new, changes = rewritten(name)
    again = _reread(name, new)
    for knob, value in changes.items():
        assert again.knobs[knob] == value, knob
    before, after = old.splitlines(), new.splitlines()
    added = [line for line in after if line not in before]
    gone = [line for line in before if line not in after]
    assert len(gone) <= len(added) and all("=" in line for line in added)
    kept = [line for line in after if line in before]
    assert [line for line in before if line not in gone] == kept  # every other line, byte for byte, in order
    for key in ("algorithm.adv_estimator", "trainer.n_gpus_per_node", A + "rollout.tensor_model_parallel_size"):
        assert not any(key in line for line in gone + added)


def _reread(name: str, text: str):
    path = EXAMPLES / name
    from memfit.interfaces.formats import verl

    return verl.read(text, path=path)


def test_a_one_line_command_gets_its_new_override_after_main_ppo():
    imported = read_config(BASE + "trainer.n_gpus_per_node=4")
    text = write_config_files(imported, {**imported.knobs, "param_offload": True, "micro_batch": 2,
                                         "grad_accum": imported.knobs["grad_accum"] * 2})[0].new_text
    assert text.startswith(f"python3 -m verl.trainer.main_ppo {A}actor.fsdp_config.param_offload=True ")
    assert f"{A}actor.ppo_micro_batch_size_per_gpu=2 " in text and "\n" not in text


def test_the_writer_keeps_the_runs_shape():
    imported = read_config(EXAMPLES / "run_qwen2-7b.sh")
    for knob, value in (("rollout_n", 8), ("vllm_tp", 4), ("method", "ppo"), ("seq_len", 4096)):
        with pytest.raises(MemfitError) as e:
            write_config_files(imported, {**imported.knobs, knob: value})
        assert "\n" not in str(e.value) and knob in str(e.value)


def test_estimate_from_a_verl_launch(capsys):
    assert main(["estimate", "--from", str(EXAMPLES / "run_qwen2-7b.sh"), "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert re.match(r"(FITS|TIGHT|OOM)\b", out) and "profile verl" in " ".join(out.split())


def test_fit_rewrites_in_place_with_a_backup(tmp_path, capsys):
    script = tmp_path / "run_grpo.sh"
    script.write_text((EXAMPLES / "run_qwen2-7b.sh").read_text())
    original = script.read_text()
    run = cards.from_file(str(script), gpu="h100")  # a card where half the micro-batch fits and the launch does not
    card = cards.card(run, {"micro_batch": run.micro_batch // 2, "grad_accum": run.grad_accum * 2})
    assert main(["fit", str(script), "--gpu", "h100", *cards.gpu_mem(card), "--in-place"]) == 0
    out = capsys.readouterr().out
    assert "-> fits" in out and script.read_text() != original
    backups = [p for p in tmp_path.iterdir() if p != script]
    assert backups and any(p.read_text() == original for p in backups)
    again = read_config(script)
    assert again.knobs["method"] == "grpo" and again.world["num_gpus"] == 8


USER_YAML = """hydra:
  searchpath:
    - pkg://verl.trainer.config
defaults:
  - ppo_trainer
  - _self_
algorithm:
  adv_estimator: grpo
actor_rollout_ref:
  actor:
    ppo_micro_batch_size_per_gpu: 6
    fsdp_config:
      param_offload: true
  rollout:
    name: vllm
    gpu_memory_utilization: 0.45
data:
  max_response_length: 2048
"""


def user_config_launch(folder: Path) -> str:
    """A launch of a user's YAML built on ppo_trainer (verl's recipe layout), with one override on top."""
    (folder / "my_grpo.yaml").write_text(USER_YAML)
    return f"python3 -m verl.trainer.main_ppo --config-path {folder} --config-name my_grpo {A}rollout.n=4"


def test_a_user_yaml_goes_under_the_overrides(tmp_path):
    k = read_config(user_config_launch(tmp_path)).knobs
    assert (k["method"], k["micro_batch"], k["param_offload"], k["vllm_gpu_memory_utilization"]) == ("grpo", 6, True, 0.45)
    assert k["seq_len"] == 512 + 2048 and k["rollout_n"] == 4  # verl's default prompt length under the YAML's
    with pytest.raises(MemfitError, match="absolute path"):
        read_config("python3 -m verl.trainer.main_ppo --config-path my_configs --config-name my_grpo")
    (tmp_path / "other.yaml").write_text("defaults:\n  - ppo_megatron_trainer\n")
    with pytest.raises(MemfitError, match="built on ppo_trainer"):
        read_config(f"python3 -m verl.trainer.main_ppo --config-path {tmp_path} --config-name other")


@pytest.mark.parametrize("word", ["data.max_prompt_length=null", f"{A}rollout.tensor_model_parallel_size=0",
                                  f"{A}rollout.tensor_model_parallel_size=3", "trainer.n_gpus_per_node=abc",
                                  f"{A}rollout.n=0", f"{A}actor.ppo_micro_batch_size_per_gpu=0",
                                  f"{A}actor.ppo_micro_batch_size_per_gpu=null", "data.max_prompt_length=[1,2",
                                  "trainer.nnodes=${trainer.nnodes}", f"{A}rollout.name=???",
                                  f"{A}actor.ppo_micro_batch_size=64"])
def test_bad_values_are_one_line_naming_the_key(word):
    with pytest.raises(MemfitError) as e:
        read_config(BASE + word)
    assert "\n" not in str(e.value) and word.split("=")[0].split(".")[-1] in str(e.value)


def test_the_knob_table_documents_the_keys_the_writer_edits():
    from memfit.facts.knobs import knobs
    from memfit.interfaces.formats.verl_write import SWITCHES, VALUES

    says = {name: k.says.get("verl", "") for name, k in knobs().items()}
    for knob, keys in {**SWITCHES, **VALUES}.items():
        assert all(key in says[knob] for key in keys), knob
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" in says["micro_batch"]
    assert "actor_rollout_ref.model.enable_gradient_checkpointing" in says["checkpointing"]


def test_the_critic_runs_on_the_actors_micro_batch():
    """memfit runs the critic on the actor's micro-batch: a larger critic micro-batch is named and caps the verdict,
    and a fit that halves the actor's halves the critic's with it."""
    ppo = BASE.replace("adv_estimator=grpo", "adv_estimator=gae") + "critic.model.path=Qwen/Qwen2.5-7B-Instruct "
    bigger = read_config(ppo + "critic.ppo_micro_batch_size_per_gpu=8")
    assert any("critic's micro-batch of 8 rows" in u for u in bigger.unread)
    same = read_config(ppo + "critic.ppo_micro_batch_size_per_gpu=4")
    assert not same.unread and same.knobs["method"] == "ppo"
    text = write_config_files(same, {**same.knobs, "micro_batch": 2, "grad_accum": same.knobs["grad_accum"] * 2})[0]
    assert "critic.ppo_micro_batch_size_per_gpu=2" in text.new_text and not read_config(text.new_text).unread
    assert read_config(ppo + "critic.ppo_micro_batch_size=32").knobs["micro_batch"] == 4  # 32 over 8 GPUs


def test_gpus_given_on_the_command_line_place_every_role(capsys):
    imported = read_config(EXAMPLES / "run_qwen2-7b.sh", gpus=4)
    assert imported.world["num_gpus"] == 4 and dict(imported.knobs["role_gpus"]) == {"actor": 4, "ref": 4}
    assert imported.knobs["vllm_engines"] == 2 and any("estimated on the 4 given" in w for w in imported.warnings)
    assert main(["estimate", "--from", str(EXAMPLES / "run_qwen2-7b.sh"), "--gpu", "h100", "--gpus", "4"]) == 0
    assert "on 4 x" in capsys.readouterr().out


def test_branches_of_the_script_are_named_as_read_in_order(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text('DEVICE=${DEVICE:-$(python3 -c "import torch_npu" && echo npu || echo gpu)}\n'
                      'case "${DEVICE}" in\n  gpu)\n    TP=2\n    ;;\n  npu)\n    TP=4\n    ;;\nesac\n' + BASE +
                      f"{A}rollout.tensor_model_parallel_size=$TP\n")
    imported = read_config(script)
    assert imported.knobs["vllm_tp"] == 4 and any("line 2: `case` branches are read in order" in w
                                                  for w in imported.warnings)
    assert not any("branches" in w for w in read_config(EXAMPLES / "run_qwen2-7b.sh").warnings)
