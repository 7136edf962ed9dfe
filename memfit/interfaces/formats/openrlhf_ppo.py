"""OpenRLHF `train_ppo_ray` commands (PPO, REINFORCE++, RLOO, GRPO, Dr. GRPO, DAPO, ProRL: every RL example of
OpenRLHF runs this script) read onto memfit's role knobs (docs/knobs.md E.2). `fit` writes back the role knobs
memfit's planner changes (offload, vLLM memory, sleep: `write_roles`); the run's shape (roles, GPUs, colocation,
engines) is the user's and is never rewritten.

The flags of each release come from its own parser (tables/openrlhf.json, rebuilt from the released
`openrlhf/cli/train_ppo_ray.py` by validate_openrlhf.openrlhf_table). What the script then does to them before
training is restated here from the same file (its checks after `parser.parse_args()`):
- only `--advantage_estimator gae` keeps a critic (its model: --critic_pretrain, else the first reward model, else
  the actor's with a remote reward); every other estimator trains the actor alone (memfit's `grpo` roles);
- a reference model exists only with `--init_kl_coef` > 0; no reward model with `--remote_rm_url` or an agent;
- `--vllm_enable_sleep` is switched off unless `--colocate_all_models`;
- ring attention and dynamic batching turn packing on, and packing turns flash attention on;
- before 0.10 the sequence is `--prompt_max_len` + `--generate_max_len` (`--max_len` only if given); from 0.10
  `--max_len` / `--data.max_len` is prompt + response.
Settings that change memory and that memfit does not model are named (tables/not_modelled.json "openrlhf_ppo").
"""
from __future__ import annotations

from typing import Callable

from memfit.interfaces.formats.base import ImportedConfig, bad, cannot
from memfit.interfaces.formats.openrlhf_knobs import _value, knobs_of
from memfit.interfaces.formats.openrlhf_command import (FORMAT, PROFILE, RELEASES, Command, flag_name, flags_of)
from memfit.interfaces.formats.not_modelled import caps, line
from memfit.interfaces.formats.tables import table

SCRIPT = "train_ppo_ray"


def _name(version: str, name: str) -> str:
    return flag_name(version, SCRIPT, name) or name


def _roles(version: str, where: str, k: dict, v) -> tuple[dict[str, int], dict[str, int]]:
    """GPUs of each role the run creates (num_nodes x num_gpus_per_node), and GPUs per node each asks for."""
    present = ["actor"] + (["ref"] if k["init_kl_coef"] > 0 else []) + (["critic"] if k["method"] == "ppo" else [])
    present += [] if k["remote_reward"] else ["reward"]
    gpus = {r: v(f"{r}_num_nodes", True) * v(f"{r}_num_gpus_per_node", True) for r in present}
    per_node = {r: v(f"{r}_num_gpus_per_node") for r in present}
    for r, n in gpus.items():
        if n <= 0:
            raise bad(where, _name(version, f"{r}_num_gpus_per_node"), f"{r} needs at least one GPU, got {n}")
    # train_ppo_ray.py asserts colocated models have the same GPUs
    for a, b, on in (("actor", "ref", k["colocate"] in ("actor-ref", "actor-ref+critic-reward", "all")),
                     ("critic", "reward", k["colocate"] in ("critic-reward", "actor-ref+critic-reward"))):
        if on and a in gpus and b in gpus and gpus[a] != gpus[b]:
            raise bad(where, _name(version, f"{b}_num_gpus_per_node"), f"colocated {a} ({gpus[a]} GPUs) and {b} "
                      f"({gpus[b]} GPUs) must have the same GPUs (OpenRLHF train_ppo_ray.py assertion)")
    return gpus, per_node


def _colocate(v) -> str:
    if v("colocate_all"):
        return "all"
    pairs = [name for name, on in (("actor-ref", v("colocate_actor_ref")), ("critic-reward", v("colocate_critic_reward")))
             if on]
    return "+".join(pairs) or "none"


def _world(k: dict, gpus: dict[str, int], per_node: dict[str, int], notes: list[str]) -> dict:
    """The GPUs the placement needs: one group per set of colocated roles (its largest role's GPUs), the vLLM
    engines apart unless everything is colocated (as memfit/roles/openrlhf.py places them)."""
    def group(role: str) -> str:
        if k["colocate"] == "all":
            return "all"
        if role in ("actor", "ref") and "actor-ref" in k["colocate"]:
            return "actor+ref"
        if role in ("critic", "reward") and "critic-reward" in k["colocate"]:
            return "critic+reward"
        return role
    sizes: dict[str, int] = {}
    for role, n in gpus.items():
        sizes[group(role)] = max(sizes.get(group(role), 0), n)
    if k["vllm_engines"]:
        g = "all" if k["colocate"] == "all" else "vllm"
        sizes[g] = max(sizes.get(g, 0), k["vllm_engines"] * k["vllm_tp"])
    needed = sum(sizes.values())
    node = max(per_node.values())
    world = {"num_gpus": needed}
    if needed % node == 0:
        world["nodes"] = needed // node
    else:
        notes.append(f"the roles need {needed} GPUs, not a whole number of {node}-GPU nodes: read as one node "
                     "(say --gpus and --nodes)")
    return world


def _lengths(version: str, k: dict, v, assumed: list[str]) -> None:
    """Sequence length and micro-batches as the script sets them (docs at the top)."""
    if k.get("seq_len") is None:  # before 0.10: --max_len is None unless given (deprecated)
        prompt, answer = v("prompt_max_len", True), v("generate_max_len", True)
        k["seq_len"] = prompt + answer
        assumed.append(f"sequence {k['seq_len']} = --prompt_max_len {prompt} + --generate_max_len {answer} "
                       "(train_ppo_ray.py max_len)")
    k["rollout_micro_batch"] = v("rollout_micro_batch", True)
    if v("dynamic_batch"):
        # a micro-step holds up to max_tokens_per_gpu tokens (packed); read as whole rows of seq_len that reach it
        train = v("train_max_tokens", True)
        rollout = v("rollout_max_tokens") or train  # the script's default: the training budget
        rows = k["micro_batch"] * k.get("grad_accum", 1)  # a GPU's rows per optimizer step (--train_batch_size)
        k["micro_batch"] = max(1, -(-train // k["seq_len"]))
        k["grad_accum"] = max(1, -(-rows // k["micro_batch"]))  # the micro-steps that hold them
        k["rollout_micro_batch"] = max(1, -(-rollout // k["seq_len"]))
        assumed.append(f"{_name(version, 'dynamic_batch')}: {train} (rollout {rollout}) tokens per GPU per "
                       f"micro-step, read as {k['micro_batch']} (rollout {k['rollout_micro_batch']}) packed rows of "
                       f"{k['seq_len']} tokens")
    if k["padding"] != "padding_free" and (v("dynamic_batch") or (v("ring") or 1) > 1):
        k["padding"] = "padding_free"
        assumed.append("packing on: train_ppo_ray.py turns --packing_samples on for ring attention and dynamic batch")
    if k["padding"] == "padding_free" and k["attention"] != "flash":
        k["attention"] = "flash"
        assumed.append("flash attention: train_ppo_ray.py sets it whenever samples are packed")


def _models(version: str, where: str, k: dict, v, assumed: list[str], warnings: list[str]) -> None:
    estimator = v("estimator", True)
    k["method"] = "ppo" if estimator == "gae" else "grpo"
    if estimator not in ("gae", "group_norm"):
        assumed.append(f"{_name(version, 'estimator')} {estimator}: no critic (train_ppo_ray.py keeps one for gae "
                       "only); read as memfit's grpo roles (no critic)")
    k["init_kl_coef"] = float(v("init_kl_coef", True))
    k["remote_reward"] = bool(v("remote_reward") or v("agent"))
    rewards = v("reward_model")
    if not k["remote_reward"]:
        if not rewards:
            raise bad(where, _name(version, "reward_model"), "the run has no reward: name a reward model or "
                      f"{_name(version, 'remote_reward')}")
        names = [r for r in str(rewards).split(",") if r]
        k["reward_model"] = names[0]
        if len(names) > 1:
            warnings.append(f"{where}: {_name(version, 'reward_model')}: {len(names)} reward models: not modelled: "
                            f"OpenRLHF loads each; memfit estimates the first only: TOO LOW by the others")
    if k["method"] == "ppo" and v("critic_model"):
        k["critic_model"] = v("critic_model")
    offload = flag_name(version, SCRIPT, "reward_offload")
    k["reward_offload"] = bool(offload and v("reward_offload"))


def _vllm(version: str, where: str, k: dict, v, warnings: list[str]) -> None:
    engines = v("vllm_engines")
    k["vllm_engines"] = engines or 0
    if not engines:
        warnings.append(f"{where}: {_name(version, 'vllm_engines')} {engines}: no vLLM engines: not modelled: the "
                        "rollouts are generated without vLLM; memfit counts no generation memory: TOO LOW")
    k["vllm_tp"] = v("vllm_tp")
    k["vllm_gpu_memory_utilization"] = float(v("vllm_gpu_memory_utilization"))
    sleep = bool(v("vllm_sleep"))
    if sleep and k["colocate"] != "all":
        warnings.append(f"{where}: {_name(version, 'vllm_sleep')}: train_ppo_ray.py turns it off without "
                        f"{_name(version, 'colocate_all')}: read as off")
        sleep = False
    if sleep and v("async"):
        raise bad(where, _name(version, "async"), f"OpenRLHF refuses async training with {_name(version, 'vllm_sleep')}")
    k["vllm_sleep"] = sleep
    k["deepspeed_sleep"] = bool(v("deepspeed_sleep"))


def _not_modelled(cmd: Command, version: str, where: str) -> list[tuple[str, str]]:
    """(warning, errs) for each flag of tables/not_modelled.json "openrlhf_ppo" the command sets away from its
    default (entries with "given": on whenever the command gives the flag)."""
    out = []
    specs = flags_of(version, SCRIPT)
    for names, entry in table("not_modelled")["openrlhf_ppo"].items():
        for flag in names.split(" | ") if not names.startswith("_") else ():
            if flag not in cmd.flags:
                continue
            value = cmd.flags[flag]
            if entry.get("given") or value != specs[flag].get("default"):
                out.append((line(where, flag, value, entry), entry["errs"]))
    return out


def read_ppo(cmd: Command, version: str, text: str, path, where: str, notes: list[str]) -> ImportedConfig:
    assumed: list[str] = []
    warnings: list[str] = []
    v = lambda name, note=False: _value(cmd, version, name, assumed if note else None)  # noqa: E731
    k: dict = {"colocate": _colocate(v)}
    _models(version, where, k, v, assumed, warnings)
    gpus, per_node = _roles(version, where, k, v)
    # the DeepSpeed side is the other scripts' (ZeRO stage, offload, LoRA, precision, attention, packing, the
    # global batch over the actor's data-parallel GPUs)
    batch_world = {"num_gpus": gpus["actor"]}
    shared, more, warned = knobs_of(cmd, version, where, batch_world)
    shared.pop("loss", None)  # log-probs come from OpenRLHF's own code; liger is named below instead
    k = {**shared, **k, "method": k["method"]}
    assumed += more
    # ring attention, AutoTP and hpZ are named with the other flags below (tables/not_modelled.json)
    warnings += [w for w in warned if "not modelled" not in w]
    _lengths(version, k, v, assumed)
    if k["padding"] == "padding_free":  # packing runs flash attention whichever release the flags fit
        notes = [n for n in notes if "no attention flag" not in n]
    _vllm(version, where, k, v, warnings)
    k["role_gpus"] = tuple(gpus.items())
    world = _world(k, gpus, per_node, assumed)
    world["global_batch"] = batch_world.get("global_batch")
    summary = ", ".join(f"{r} {n}" for r, n in gpus.items())
    vllm = f", vLLM {k['vllm_engines']} x tp {k['vllm_tp']}" if k["vllm_engines"] else ""
    assumed.insert(0, f"flag style of OpenRLHF {RELEASES[version]}")
    assumed.insert(1, f"{world['num_gpus']} GPUs for {summary}{vllm} (colocate {k['colocate']})")
    # the other reward models and generation without vLLM are memory memfit leaves out (TOO LOW): they cap too
    unmodelled = [(w, "low") for w in warnings if "TOO LOW" in w] + _not_modelled(cmd, version, where)
    warnings = [w for w in warnings if "TOO LOW" not in w] + [w for w, _ in unmodelled] + notes
    model = v("model")
    return ImportedConfig(format=FORMAT, profile=PROFILE, knobs=k, text=text, doc=cmd, path=path,
                          model_name=model if isinstance(model, str) and not model.startswith("$") else None,
                          world=world, variant=version, assumed=assumed, warnings=warnings, **caps(unmodelled))


# what memfit's planner may change in a train_ppo_ray run (planner/space.py role_options); `ref_offload` is
# written with the other scripts' knobs
WRITTEN = frozenset({"reward_offload", "vllm_gpu_memory_utilization", "vllm_sleep", "deepspeed_sleep"})
# the run's shape: read, never rewritten (another placement is another experiment, not a memory setting)
SHAPE = frozenset({"colocate", "vllm_engines", "vllm_tp", "rollout_micro_batch", "role_gpus", "remote_reward",
                   "reward_model", "critic_model", "init_kl_coef"})


def role_knobs(imported: ImportedConfig) -> frozenset:
    """The knobs `write_roles` writes rather than the other scripts' writer: under dynamic batching the
    micro-batch is a token budget and OpenRLHF counts the micro-steps itself."""
    dynamic = _value(imported.doc, imported.variant_read, "dynamic_batch")
    return SHAPE | WRITTEN | (frozenset({"micro_batch", "grad_accum"}) if dynamic else frozenset())


def write_roles(imported: ImportedConfig, changes: dict, put: Callable, switch: Callable) -> None:
    """The role knobs of `changes` onto the command's flags (through the writer's put / switch)."""
    if "micro_batch" in changes and "micro_batch" in role_knobs(imported):
        _token_budget(imported, changes, put)
    for knob in SHAPE.intersection(changes):
        raise cannot(imported, knob, changes[knob], "memfit keeps train_ppo_ray's roles, GPUs, colocation and vLLM "
                     "engines as the command has them; edit the command by hand")
    one_flag = bool({"ref_offload", "reward_offload"} & set(changes)) and _one_offload_flag(imported, changes)
    for knob in sorted(WRITTEN.intersection(changes)):
        value = changes[knob]
        if knob == "vllm_gpu_memory_utilization":
            put(knob, knob, value)
        elif knob != "reward_offload" or not one_flag:
            switch(knob, knob, bool(value))


def _token_budget(imported: ImportedConfig, changes: dict, put: Callable) -> None:
    """A micro-batch of whole rows as dynamic batching's tokens per GPU (what `_lengths` reads back); the
    rollout keeps its own budget, which defaults to the training one."""
    version, k = imported.variant_read, imported.knobs
    seq = changes.get("seq_len", k["seq_len"])
    if not _value(imported.doc, version, "rollout_max_tokens"):
        put("rollout_max_tokens", "rollout_micro_batch", _value(imported.doc, version, "train_max_tokens"))
    put("train_max_tokens", "micro_batch", changes["micro_batch"] * seq)


def _one_offload_flag(imported: ImportedConfig, changes: dict) -> bool:
    """Before 0.10.2 one flag (--ref_reward_offload) offloads the reference and the reward model together:
    True when it is that flag, written by ref_offload (a run without a reference leaves it to the reward model)."""
    version, k = imported.variant_read, imported.knobs
    if flag_name(version, SCRIPT, "ref_offload") != flag_name(version, SCRIPT, "reward_offload"):
        return False
    has_ref, has_reward = k.get("init_kl_coef", 0) > 0, not k.get("remote_reward")
    ref = changes.get("ref_offload", k.get("ref_offload"))
    reward = changes.get("reward_offload", k.get("reward_offload"))
    if has_ref and has_reward and bool(ref) != bool(reward):
        raise cannot(imported, "reward_offload", reward, f"OpenRLHF {RELEASES[version]} offloads the reference and "
                     f"the reward model together ({_name(version, 'ref_offload')})")
    return has_ref
