"""verl's own example launches (GRPO and PPO, FSDP) through `memfit estimate --from` and `memfit fit`, as
test_launch_corpus.py takes the other frameworks' launches. Each copy under verl_examples/ starts with its source
line; the nearest stored commit to verl 0.9.1 is the release/v0.9.0 branch of verl-project/verl (88512193628b,
2026-08-20); run_qwen2-7b.sh is volcengine/verl b178a3cd56f5 (2026-01-29), a plain one-command launch.

- estimate: a verdict and a number, or the one-line error the case records (a model the catalog lacks, offline);
- fit: on a card derived from memfit's own verdict (tests/cards.py) one step under the smallest on which the
  launch as written fits, fit writes the launch back with only override lines changed, and it re-reads to a
  fitting run with the same roles, GPUs and algorithm. verl's own composition of what fit writes:
  test_verl_venv.py."""
import re
from pathlib import Path

import pytest

import cards
from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import read_config

HERE = Path(__file__).resolve().parent / "verl_examples"
# file -> (method, the one-line estimate error it records, or None)
CORPUS = {
    "run_qwen2-7b.sh": ("grpo", None),
    "run_qwen3_8b_fsdp.sh": ("ppo", None),
    "run_seed_oss_36b_fsdp.sh": ("grpo", "not in the catalog"),
    "run_mistral_nemo_12b_skyworkrm_fsdp.sh": ("grpo", "not in the catalog"),
}
FITTED = [name for name, (_, gap) in CORPUS.items() if gap is None]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))


def test_every_example_cites_its_source():
    for name in CORPUS:
        first = (HERE / name).read_text().splitlines()[0]
        assert re.match(r"# source: github\.com/[\w-]+/verl examples/\S+\.sh at [0-9a-f]{40}", first), name


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_estimate(name, capsys):
    method, gap = CORPUS[name]
    code = main(["estimate", "--from", str(HERE / name), "--gpu", "h100"])
    out, err = capsys.readouterr()
    if gap:
        assert code != 0 and gap in err and len(err.strip().splitlines()) == 1
        return
    assert code == 0 and re.match(r"(FITS|TIGHT|OOM): [\d.]+ GiB per GPU", out), out[:200]
    assert f"{method}: roles" in out


def fit_card(name: str) -> list[str]:
    """--gpu-mem one grid step under the smallest card on which the launch as written fits: fit must change it."""
    run = cards.from_file(str(HERE / name), gpu="h100")
    return cards.gpu_mem(cards.smallest_fitting(run) - cards.STEP)


def fit_into(name: str, folder: Path) -> Path:
    """`memfit fit` of the example into `folder`; the rewritten launch's path."""
    assert main(["fit", str(HERE / name), "--gpu", "h100", *fit_card(name), "--out", str(folder)]) == 0
    return folder / name


@pytest.mark.parametrize("name", FITTED)
def test_fit_writes_only_overrides_and_keeps_the_run(name, tmp_path, capsys):
    written = fit_into(name, tmp_path)
    out = capsys.readouterr().out
    assert re.search(r"-> fits \([\d.]+ GiB", out), out[:300]
    old, new = (HERE / name).read_text().splitlines(), written.read_text().splitlines()
    changed = [line for line in new if line not in old]
    assert changed and all(re.search(r"[\w.]+=\S+", line) for line in changed)
    assert [line for line in old if line in new] == [line for line in new if line in old]
    before, after = read_config(HERE / name), read_config(written)
    for knob in ("method", "role_gpus", "vllm_tp", "vllm_engines", "seq_len", "rollout_n", "init_kl_coef",
                 "remote_reward", "tuning"):
        assert after.knobs[knob] == before.knobs[knob], knob
    assert after.world == before.world and after.model_name == before.model_name
