"""verl launches: `python3 -m verl.trainer.main_ppo key=value ...` in a shell script or alone (verl 0.9.1, the
Hydra config `verl/trainer/config/ppo_trainer.yaml`), read onto memfit's knobs; `write` (verl_write.py) edits only
the overrides a fit changes.

Each key is resolved as Hydra composes it (verl_overrides.py): verl's defaults (tables/verl.json, derived from the
installed verl by verl_compose.py), a user YAML named by --config-path / --config-name on top, the launch's
overrides on top of that, interpolations resolved. A key verl's config lacks is one line naming it and the nearest
key it has. What verl then does with the keys memfit models is read from verl 0.9.1's own code:
- roles (verl/trainer/ppo/utils.py): a reference when actor.use_kl_loss or algorithm.use_kl_in_reward
  (need_reference_policy); a critic when critic.enable, else when algorithm.adv_estimator is gae (need_critic); a
  reward model when reward.reward_model.enable (need_reward_model; main_ppo does not migrate the legacy
  reward_model.* keys, only fully_async_main does);
- placement: the hybrid engine puts actor, rollout (vLLM, one engine per rollout.tensor_model_parallel_size GPUs)
  and reference on every GPU of trainer.n_gpus_per_node x trainer.nnodes; critic and reward model share that pool;
- batches (verl/workers/config/actor.py, workers/engine_workers.py): ppo_mini_batch_size x rollout.n rows per
  update over the GPUs, in micro-batches of ppo_micro_batch_size_per_gpu rows (the deprecated global
  ppo_micro_batch_size is divided by the GPUs); under use_dynamic_bsz a micro-batch holds up to
  ppo_max_token_len_per_gpu tokens (log-prob passes: log_prob_max_token_len_per_gpu), read as whole rows of
  data.max_prompt_length + data.max_response_length tokens.
Settings that change memory and that memfit does not model are named (tables/not_modelled.json "verl").
"""
from __future__ import annotations

from pathlib import Path

from memfit.interfaces.formats.base import ImportedConfig, bad, lora_targets, read_text, shown
from memfit.interfaces.formats.not_modelled import caps, line
from memfit.interfaces.formats.tables import table
from memfit.interfaces.formats.verl_batches import batches
from memfit.interfaces.formats.verl_command import Launch, find_launch, is_verl
from memfit.interfaces.formats.verl_overrides import MISSING, Config, parse_override
from memfit.interfaces.formats.verl_write import write as write_launch
from memfit.interfaces.formats.yamltext import yaml

FORMAT = PROFILE = "verl"
A = "actor_rollout_ref."
STRATEGIES = {"fsdp": 1, "fsdp2": 2}
ROLLOUTS = ("vllm",)


def config_of(launch: Launch, where: str) -> Config:
    """verl's composed config for the launch (defaults, a user YAML, the overrides)."""
    facts = table("verl")
    cfg = Config(facts["keys"], facts["mappings"], where, facts["version"])
    if launch.options:
        _user_yaml(cfg, launch, where)
    for word in launch.words:
        cfg.apply(parse_override(word, where))
    return cfg


def _user_yaml(cfg: Config, launch: Launch, where: str) -> None:
    """`--config-path DIR --config-name NAME`: a YAML built on ppo_trainer (its defaults list names it) whose keys
    go over verl's defaults, as Hydra merges a primary config after its defaults."""
    name = launch.options.get("config_name", facts_config())
    folder = _config_folder(launch, where)
    if folder is None:
        if name != facts_config():
            raise bad(where, "--config-name", f"{name} of verl's own configs is not modelled; memfit reads "
                      f"{facts_config()} (FSDP) and YAMLs built on it")
        return
    path = (folder / (name if name.endswith(".yaml") else f"{name}.yaml")).resolve()
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError:
        raise bad(where, "--config-path", f"no config {path}") from None
    except yaml.YAMLError as e:
        raise bad(str(path), None, f"not YAML: {str(e).splitlines()[0]}") from None
    defaults = doc.pop("defaults", [])
    if not isinstance(doc, dict) or facts_config() not in [d for d in defaults if isinstance(d, str)]:
        raise bad(str(path), "defaults", f"memfit reads verl configs built on {facts_config()} (defaults: "
                  f"[{facts_config()}, _self_]); this one is not")
    doc.pop("hydra", None)
    for key, value in _flat(doc, ""):
        cfg._put(key, value)


def _config_folder(launch: Launch, where: str) -> Path | None:
    """The folder of a user's config, as Hydra finds it: --config-dir relative to where the launch runs; an absolute
    --config-path; a relative --config-path is relative to verl/trainer/ of the installed verl (Hydra resolves it
    from main_ppo.py's folder), where `config` is verl's own. None: verl's own config folder."""
    if launch.options.get("config_dir"):
        return launch.cwd / launch.options["config_dir"]
    folder = launch.options.get("config_path")
    if folder is None or folder.rstrip("/") in ("config", "./config", "pkg://verl.trainer.config"):
        return None
    if not Path(folder).is_absolute():
        raise bad(where, "--config-path", f"{folder}: Hydra reads a relative --config-path from verl/trainer/ of the "
                  "installed verl; give the folder's absolute path (e.g. $(pwd)/" + folder + ") or --config-dir")
    return Path(folder)


def facts_config() -> str:
    return table("verl")["config"]


def _flat(node: dict, prefix: str):
    for key, value in node.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _flat(value, full + ".")
        else:
            yield full, value


class Reader:
    """The knobs of one composed config, with what was assumed and what memfit cannot read."""

    def __init__(self, cfg: Config, where: str):
        self.cfg, self.where = cfg, where
        self.knobs: dict = {}
        self.assumed: list[str] = []
        self.warnings: list[str] = []
        self.unmodelled: list[tuple[str, str]] = []

    def get(self, key: str, kind=None):
        value = self.cfg.get(key)
        if isinstance(value, str) and "$" in value and kind is not None:
            raise bad(self.where, key, f"{shown(value)} is a shell variable the script does not set; memfit needs "
                      "the value")
        if kind is int and value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise bad(self.where, key, f"expected an integer, got {shown(value)}")
        if kind is float and value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise bad(self.where, key, f"expected a number, got {shown(value)}")
        if kind is bool and value is not None and not isinstance(value, bool):
            raise bad(self.where, key, f"expected true or false, got {shown(value)}")
        return value

    def need(self, key: str, kind, minimum: int | None = None):
        """A value verl needs set (verl itself refuses the run without it), of `kind`, at least `minimum`."""
        value = self.get(key, kind)
        if value is None or value == MISSING:
            raise bad(self.where, key, "not set: verl needs a value here")
        if minimum is not None and value < minimum:
            raise bad(self.where, key, f"must be at least {minimum}, got {shown(value)}")
        return value

    def unread(self, key: str, errs: str, does: str, memfit: str) -> None:
        value = self.cfg.get(key) if self.cfg.has(key) else None
        self.unmodelled.append((line(self.where, key, value, {"does": does, "memfit": memfit}), errs))

    def read(self, gpus: int | None = None) -> tuple[dict, dict]:
        """The knobs and the world; `gpus`: the GPU count the run is estimated on, when not the launch's."""
        self._engine()
        self._roles()
        self._tuning()
        self._lengths()
        self._batches()
        self._rollout()
        self._not_modelled()
        return self.knobs, self._world(gpus)

    def _engine(self) -> None:
        k, g = self.knobs, self.get
        k["engine"] = "fsdp"
        for role in (A + "actor", A + "ref", "critic"):
            strategy = g(f"{role}.strategy")
            if strategy not in STRATEGIES:
                self.unread(f"{role}.strategy", "either", f"the {strategy} engine (not FSDP)", "FSDP's memory")
        strategy = g(A + "actor.strategy")
        k["fsdp_version"] = STRATEGIES.get(strategy, 2)
        k["checkpointing"] = "full" if g(A + "model.enable_gradient_checkpointing", bool) else "off"
        k["remove_padding"] = bool(g(A + "model.use_remove_padding", bool))
        k["padding"] = "padding_free" if k["remove_padding"] else "padded"
        k["param_offload"] = bool(g(A + "actor.fsdp_config.param_offload", bool))
        k["optimizer_offload"] = bool(g(A + "actor.fsdp_config.optimizer_offload", bool))
        k["ref_offload"] = bool(g(A + "ref.fsdp_config.param_offload", bool))
        k["entropy_chunking"] = bool(g(A + "actor.entropy_from_logits_with_chunking", bool))
        k["entropy_checkpointing"] = bool(g(A + "actor.entropy_checkpointing", bool))
        optimizer = (g(A + "actor.optim.optimizer_impl"), g(A + "actor.optim.optimizer"))
        if optimizer != ("torch.optim", "AdamW"):
            self.unread(A + "actor.optim.optimizer", "either", f"the optimizer {'.'.join(map(str, optimizer))}",
                        "torch.optim.AdamW's two fp32 states")

    def _roles(self) -> None:
        k, g = self.knobs, self.get
        estimator = g("algorithm.adv_estimator")
        enable = g("critic.enable")
        critic = bool(enable) if enable is not None else estimator == "gae"
        k["method"] = "ppo" if critic else "grpo"
        if estimator not in ("gae", "grpo") or (enable is not None and critic != (estimator == "gae")):
            self.assumed.append(f"algorithm.adv_estimator {estimator}, critic.enable {enable}: "
                                f"{'a' if critic else 'no'} critic (verl need_critic): read as memfit's "
                                f"{k['method']} roles")
        if critic:
            k["critic_model"] = g("critic.model.path")
            k["critic_param_offload"] = bool(g("critic.fsdp.param_offload", bool))
            k["critic_optimizer_offload"] = bool(g("critic.fsdp.optimizer_offload", bool))
        kl_loss, kl_reward = g(A + "actor.use_kl_loss", bool), g("algorithm.use_kl_in_reward", bool)
        coef = (g(A + "actor.kl_loss_coef", float) if kl_loss else 0) or (
            g("algorithm.kl_ctrl.kl_coef", float) if kl_reward else 0)
        if (kl_loss or kl_reward) and not coef:
            coef = 1e-6  # the reference still runs (need_reference_policy reads the switches, not the coefficient)
            self.assumed.append("a reference model: use_kl_loss / use_kl_in_reward is on with a zero coefficient")
        k["init_kl_coef"] = float(coef)
        k["remote_reward"] = not g("reward.reward_model.enable", bool)
        if not k["remote_reward"]:
            k["reward_model"] = g("reward.reward_model.model_path")
            self.unread("reward.reward_model.enable", "either", "a reward model served by its own rollout engine "
                        "(reward.reward_model.rollout)", "it as a frozen model on the training GPUs")
        if g("reward_model.enable") or g("reward_model.model.path"):
            self.warnings.append(f"{self.where}: reward_model.*: verl 0.9.1's main_ppo does not read the legacy "
                                 "reward_model keys (only fully_async_main migrates them): no reward model; use "
                                 "reward.reward_model.enable / model_path")

    def _tuning(self) -> None:
        k, g = self.knobs, self.get
        rank = g(A + "model.lora_rank", int) or 0
        k["tuning"] = "lora" if rank > 0 else "full"
        if rank > 0:
            k["lora_rank"] = rank
            k["lora_alpha"] = g(A + "model.lora_alpha", int)
            k["lora_targets"] = lora_targets(self.where, A + "model.target_modules", g(A + "model.target_modules"))

    def _lengths(self) -> None:
        k = self.knobs
        prompt, response = self.need("data.max_prompt_length", int, 1), self.need("data.max_response_length", int, 1)
        k["response_len"] = response
        k["seq_len"] = prompt + response
        self.assumed.append(f"sequence {k['seq_len']} = data.max_prompt_length {prompt} + data.max_response_length "
                            f"{response} (verl pads prompts and responses to these)")
        k["rollout_n"] = self.need(A + "rollout.n", int, 1)

    def _batches(self) -> None:
        batches(self)

    def _rollout(self) -> None:
        k, g = self.knobs, self.get
        name = g(A + "rollout.name")
        if name == MISSING:
            raise bad(self.where, A + "rollout.name", "verl requires it (vllm or sglang): the launch does not set it")
        if name not in ROLLOUTS:
            self.unread(A + "rollout.name", "either", f"the {name} rollout engine", "vLLM's memory")
        k["vllm_tp"] = self.need(A + "rollout.tensor_model_parallel_size", int, 1)
        k["vllm_gpu_memory_utilization"] = float(self.need(A + "rollout.gpu_memory_utilization", float))
        k["vllm_sleep"] = bool(g(A + "rollout.free_cache_engine", bool))
        k["colocate"] = "all"

    def _world(self, given: int | None) -> dict:
        k = self.knobs
        per_node, nodes = self.need("trainer.n_gpus_per_node", int, 1), self.need("trainer.nnodes", int, 1)
        gpus = per_node * nodes
        world = {"num_gpus": gpus, "nodes": nodes}
        if given is not None and given != gpus:
            self.warnings.append(f"{self.where}: trainer.n_gpus_per_node x trainer.nnodes = {gpus} GPUs; the run "
                                 f"is estimated on the {given} given")
            gpus, world = given, {"num_gpus": given}
        if gpus % k["vllm_tp"]:
            raise bad(self.where, A + "rollout.tensor_model_parallel_size", f"{k['vllm_tp']} does not divide the "
                      f"{gpus} GPUs (verl makes one rollout engine per tensor-parallel group)")
        k["vllm_engines"] = gpus // k["vllm_tp"]
        roles = ["actor"] + (["ref"] if k["init_kl_coef"] > 0 else []) + (["critic"] if k["method"] == "ppo" else [])
        roles += [] if k["remote_reward"] else ["reward"]
        k["role_gpus"] = tuple((r, gpus) for r in roles)
        self.assumed.insert(0, f"{gpus} GPUs for {', '.join(roles)} and {k['vllm_engines']} vLLM engine(s) x tp "
                            f"{k['vllm_tp']}, all colocated (verl's hybrid engine)")
        return world

    def _not_modelled(self) -> None:
        entries = table("not_modelled")["verl"]
        facts = table("verl")
        defaults = Config(facts["keys"], facts["mappings"], self.where, facts["version"])
        for key, entry in entries.items():
            if key.startswith("_") or not self.cfg.has(key):
                continue
            value = self.cfg.get(key)
            stated = key in self.cfg.stated or any(s.startswith(key + ".") for s in self.cfg.stated)
            if (entry.get("given") and stated and value) or (not entry.get("given") and value != defaults.get(key)):
                self.unmodelled.append((line(self.where, key, value, entry), entry["errs"]))


def read(path_or_text, *, gpus: int | None = None, files: dict | None = None, path: Path | None = None) -> ImportedConfig:
    if isinstance(path_or_text, str) and is_verl(path_or_text):  # a command line, even on one line
        text, source = path_or_text, None
    else:
        text, source = read_text(path_or_text, "verl launch")
    source = source or path
    where = str(source) if source else "verl launch"
    cwd = source.parent if source else Path.cwd()
    launch = find_launch(text, where, cwd)
    cfg = config_of(launch, where)
    reader = Reader(cfg, where)
    knobs, world = reader.read(gpus)
    model = cfg.get(A + "model.path")
    unmodelled = reader.unmodelled
    assumed = [f"verl {table('verl')['version']} ppo_trainer config (tables/verl.json)", *reader.assumed]
    warnings = reader.warnings + launch.notes + [w for w, _ in unmodelled]
    return ImportedConfig(format=FORMAT, profile=PROFILE, knobs=knobs, text=text, doc=(launch, cfg), path=source,
                          model_name=model if isinstance(model, str) and "$" not in model else None,
                          world=world, variant=table("verl")["version"], assumed=assumed, warnings=warnings,
                          **caps(unmodelled))


def write(imported: ImportedConfig, knobs: dict) -> str:
    return write_launch(imported, knobs, read)
