"""verl's own composition (Hydra 1.3.8 over verl 0.9.1's ppo_trainer config, then verl's config dataclasses
FSDPActorConfig / RolloutConfig / AlgoConfig) of every launch memfit reads and writes, in verl's venv
(`bash tests/trace/setup_verl_venv.sh`: .venvs/verl). It proves:
- tables/verl.json is what the installed verl composes (regenerate: python -c "from
  memfit.interfaces.formats.validate_verl import write_table; write_table()");
- memfit's composition of each example launch equals Hydra's for every key of the config;
- every launch `memfit fit` rewrites (test_verl_corpus.fit_into) and every writer change of test_verl.CHANGES is
  accepted by verl's composition and dataclasses, with the roles, GPUs and algorithm unchanged and the changed
  keys at their new values;
- a key Hydra refuses memfit refuses too."""
import json
import re
from pathlib import Path

import pytest

from memfit.errors import MemfitError
from memfit.interfaces.formats import read_config, validate_verl, verl
from memfit.interfaces.formats.verl_command import find_launch
from memfit.interfaces.formats.verl_overrides import MISSING

pytestmark = pytest.mark.extras  # verl's own venv (not a package of memfit's environment)

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE / "verl_examples"
A = "actor_rollout_ref."
# what makes the run the run: its algorithm, roles and their models, GPUs, rollout parallelism and lengths
SHAPE = ("algorithm.adv_estimator", "critic.enable", A + "actor.use_kl_loss", "algorithm.use_kl_in_reward",
         "reward.reward_model.enable", "reward.reward_model.model_path", A + "model.path", "critic.model.path",
         "trainer.n_gpus_per_node", "trainer.nnodes", A + "rollout.tensor_model_parallel_size", A + "rollout.n",
         A + "rollout.name", "data.max_prompt_length", "data.max_response_length", A + "actor.ppo_mini_batch_size",
         "data.train_batch_size", A + "actor.strategy", A + "model.lora_rank")


@pytest.fixture(scope="module")
def verl_venv():
    if not (validate_verl.VERL_VENV / "bin" / "python").exists():
        pytest.skip(f"no verl venv at {validate_verl.VERL_VENV} (bash tests/trace/setup_verl_venv.sh)")


def _launch(path: Path, text: str | None = None):
    """The launch as verl receives it; a `$(command)` the script runs (its experiment name's `$(date ...)`) stands
    for its output, a word (memfit reads no key that holds one)."""
    launch = find_launch(text if text is not None else path.read_text(), str(path), path.parent)
    launch.words = [re.sub(r"\$\([^)]*\)", "OUTPUT", w) for w in launch.words]
    return launch


@pytest.fixture(scope="module")
def composed(verl_venv, tmp_path_factory):
    """Hydra's composition of each example, of what fit writes for it and of each writer change, in one process."""
    from test_verl import CHANGES, rewritten
    from test_verl_corpus import FITTED, fit_into

    runs = {}
    for path in sorted(EXAMPLES.glob("*.sh")):
        runs[("example", path.name)] = (path, path.read_text())
    for name in CHANGES:
        runs[("written", name)] = (EXAMPLES / name, rewritten(name)[1])
    folder = tmp_path_factory.mktemp("fit")
    for name in FITTED:
        written = fit_into(name, folder)
        runs[("fit", name)] = (EXAMPLES / name, written.read_text())
    bad = {"typo": f"{A}actor.fsdp_config.param_ofload=True", "append": "+trainer.nnodes=2",
           "old_critic_key": "critic.model.fsdp_config.param_offload=False"}
    base = f"python3 -m verl.trainer.main_ppo {A}rollout.name=vllm {A}actor.ppo_micro_batch_size_per_gpu=2 "
    for label, word in bad.items():
        runs[("bad", label)] = (EXAMPLES / "inline.sh", base + word)
    runs[("force", "nnodes")] = (EXAMPLES / "inline.sh", base + "++trainer.nnodes=2")
    from test_verl import user_config_launch

    runs[("force", "user_yaml")] = (EXAMPLES / "inline.sh", user_config_launch(tmp_path_factory.mktemp("yaml")))
    results = validate_verl.compose_launches([_launch(p, t) for p, t in runs.values()])
    return {key: (runs[key], result) for key, result in zip(runs, results)}


def test_the_table_is_what_the_installed_verl_composes(verl_venv):
    stored = json.loads(validate_verl.TABLE.read_text())
    derived = validate_verl.derived_table()
    assert derived["version"] == stored["version"] == "0.9.1"
    assert derived["keys"] == stored["keys"] and sorted(derived["mappings"]) == sorted(stored["mappings"])


def test_memfit_composes_every_key_as_hydra_does(composed):
    for (kind, name), ((path, text), result) in composed.items():
        if kind not in ("example", "force"):
            continue
        assert "error" not in result, (name, result.get("error"))
        cfg = verl.config_of(_launch(path, text), str(path))  # the same words verl was given
        hydra = result["config"]
        mine = {k: None if cfg.get(k) == MISSING else cfg.get(k) for k in hydra}  # OmegaConf reads ??? as None
        differ = {k: (mine[k], v) for k, v in hydra.items() if k not in result["unresolved"] and mine[k] != v}
        assert not differ, (name, dict(list(differ.items())[:5]))


def test_every_rewritten_launch_is_accepted_by_verl_with_the_run_unchanged(composed):
    from test_verl import CHANGES

    for (kind, name), ((path, text), result) in composed.items():
        if kind not in ("written", "fit"):
            continue
        assert "error" not in result, (kind, name, result.get("error"))
        original = composed[("example", name)][1]
        assert result["dataclasses"] == original["dataclasses"] and original["dataclasses"][A + "actor"] == "ok"
        assert set(result["unresolved"]) == set(original["unresolved"])
        for key in SHAPE:
            assert result["config"].get(key) == original["config"].get(key), (kind, name, key)
        if kind == "written":  # the asked knobs, as verl's composed config holds them
            reread = verl.read(text, path=path)
            for knob, value in CHANGES[name].items():
                assert reread.knobs[knob] == value, (name, knob)
        changed = {k for k, v in result["config"].items() if original["config"].get(k) != v}
        assert changed and all(k.startswith((A, "critic.")) for k in changed), (kind, name, changed)


def test_a_key_hydra_refuses_memfit_refuses(composed):
    for (kind, name), ((_path, text), result) in composed.items():
        if kind != "bad":
            continue
        assert "error" in result, name
        with pytest.raises(MemfitError) as e:
            read_config(text)
        assert "\n" not in str(e.value)
    assert composed[("force", "nnodes")][1]["config"]["trainer.nnodes"] == 2
