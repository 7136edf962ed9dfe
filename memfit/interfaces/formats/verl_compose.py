"""verl's own config composition, run inside verl's virtual environment (`.venvs/verl`: verl 0.9.1, Hydra 1.3.8,
OmegaConf 2.3.0; tests/trace/setup_verl_venv.sh). memfit's core never imports this module's dependencies: the
verl reader (verl.py) works from the table this module derives (tables/verl.json), and the tests run it through
`validate_verl.py` to check memfit's reading against verl's.

    python -m memfit.interfaces.formats.verl_compose table            # the table: every key of ppo_trainer, raw
    python -m memfit.interfaces.formats.verl_compose compose K=V ...  # one launch's overrides, composed by Hydra
    python -m memfit.interfaces.formats.verl_compose batch < runs.json  # several launches, one process

`compose` prints the composed config flattened and resolved, and whether verl's own config dataclasses
(verl.workers.config: FSDPActorConfig, FSDPCriticConfig, RolloutConfig ... through verl.utils.omega_conf_to_dataclass)
accept it, the way verl.trainer.main_ppo builds them before any GPU work."""
from __future__ import annotations

import json
import os
import sys

CONFIG_NAME = "ppo_trainer"
# sections verl turns into its config dataclasses and that build offline on the CPU: the actor (FSDPActorConfig:
# micro-batch and token-budget checks), the rollout (RolloutConfig) and the algorithm (AlgoConfig). The model and
# critic sections load the model's HF config from the hub (HFModelConfig), so they are composed but not built.
DATACLASS_SECTIONS = ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "algorithm")


def _flatten(node, prefix: str, out: dict, dicts: list) -> None:
    if isinstance(node, dict):
        dicts.append(prefix)
        for key, value in node.items():
            _flatten(value, f"{prefix}.{key}" if prefix else str(key), out, dicts)
    else:
        out[prefix] = node


def _compose(overrides: list[str], config_dir: str | None = None, config_name: str | None = None):
    import verl
    from hydra import compose, initialize_config_dir

    own = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=os.path.abspath(config_dir or own), version_base=None):
        return compose(config_name=config_name or CONFIG_NAME, overrides=overrides)


def table() -> dict:
    """Every key of the composed default config with its raw value (interpolations as written), and the keys
    that hold a mapping (a `+key.sub=` addition may go under them)."""
    import verl
    from omegaconf import OmegaConf

    leaves: dict = {}
    dicts: list = []
    _flatten(OmegaConf.to_container(_compose([]), resolve=False), "", leaves, dicts)
    return {"source": f"verl {verl.__version__} verl/trainer/config/{CONFIG_NAME}.yaml composed by Hydra "
                      "(python -m memfit.interfaces.formats.verl_compose table, in verl's venv)",
            "version": verl.__version__, "config": CONFIG_NAME, "keys": leaves, "mappings": [d for d in dicts if d]}


def _dataclasses(cfg) -> dict:
    """Each section through verl's own omega_conf_to_dataclass (its __post_init__ checks), "ok" or the error."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    out = {}
    for section in DATACLASS_SECTIONS:
        node = OmegaConf.select(cfg, section)
        if node is None or "_target_" not in node:
            continue
        try:
            omega_conf_to_dataclass(node)
            out[section] = "ok"
        except Exception as e:  # noqa: BLE001 - reported back, one line
            out[section] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return out


def composed(overrides: list[str], config_dir: str | None = None, config_name: str | None = None) -> dict:
    from omegaconf import OmegaConf

    try:
        cfg = _compose(overrides, config_dir, config_name)
    except Exception as e:  # noqa: BLE001 - Hydra's refusal is the answer
        return {"error": f"{type(e).__name__}: {e}"}
    raw: dict = {}
    _flatten(OmegaConf.to_container(cfg, resolve=False), "", raw, [])
    leaves, unresolved = {}, {}
    for key in raw:  # one by one: an interpolation verl would fail on (a shell variable left as ${NAME}) is named
        try:
            value = OmegaConf.select(cfg, key, throw_on_missing=False)
            leaves[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except Exception as e:  # noqa: BLE001
            unresolved[key] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return {"config": leaves, "unresolved": unresolved, "dataclasses": _dataclasses(cfg)}


def main(argv: list[str]) -> None:
    if argv[:1] == ["table"]:
        print(json.dumps(table(), indent=1))
        return
    if argv[:1] == ["batch"]:  # several launches in one process: a JSON list of {"words", "options"} on stdin
        runs = json.loads(sys.stdin.read())
        out = [composed(r["words"], r.get("options", {}).get("config_path"), r.get("options", {}).get("config_name"))
               for r in runs]
        print("MEMFIT-RESULT " + json.dumps(out, default=str))
        return
    if argv[:1] == ["compose"]:
        words = argv[1:]
        config_dir = config_name = None
        while words and words[0] in ("--config-path", "--config-name"):
            if words[0] == "--config-path":
                config_dir = words[1]
            else:
                config_name = words[1]
            words = words[2:]
        print("MEMFIT-RESULT " + json.dumps(composed(words, config_dir, config_name), default=str))
        return
    raise SystemExit("usage: python -m memfit.interfaces.formats.verl_compose table | compose [--config-path DIR] "
                     "[--config-name NAME] KEY=VALUE ...")


if __name__ == "__main__":
    main(sys.argv[1:])
