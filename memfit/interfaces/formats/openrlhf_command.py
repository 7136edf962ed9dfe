"""OpenRLHF command lines as argparse reads them: the `openrlhf.cli.train_*` module in a script or alone, its
flags tokenized with their positions (so a rewrite edits only what changed), checked against the flag table of
the release that knows them all (tables/openrlhf.json), and the GPU counts its launcher gives."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from memfit.interfaces.formats.base import as_int, bad, suggest
from memfit.interfaces.formats.tables import table

FORMAT = "openrlhf"
PROFILE = "openrlhf"
VERSIONS = ("0.11.2", "0.10.1", "0.9.1", "0.8.9")  # newest first
RELEASES = {"0.8.9": "<= 0.8.9", "0.9.1": "0.8.10-0.9.1", "0.10.1": "0.9.2-0.10.1", "0.11.2": ">= 0.10.2"}
PPO = "train_ppo_ray"
# train_ppo_ray's method follows --advantage_estimator (openrlhf_ppo.py); "ppo" until it is read
METHODS = {"train_sft": "sft", "train_dpo": "dpo", "train_rm": "rm", PPO: "ppo"}

# memfit's name for a flag -> (legacy name, dotted name)
FLAGS = {
    "zero_stage": ("--zero_stage", "--ds.zero_stage"),
    "adam_offload": ("--adam_offload", "--ds.adam_offload"),
    "checkpointing": ("--gradient_checkpointing", "--model.gradient_checkpointing_enable"),
    "reentrant": ("--gradient_checkpointing_use_reentrant", "--model.gradient_checkpointing_reentrant"),
    "micro_batch": ("--micro_train_batch_size", "--train.micro_batch_size"),
    "global_batch": ("--train_batch_size", "--train.batch_size"),
    "seq_len": ("--max_len", "--data.max_len"),
    "model": ("--pretrain", "--model.model_name_or_path"),
    "lora_rank": ("--lora_rank", "--ds.lora.rank"),
    "lora_alpha": ("--lora_alpha", "--ds.lora.alpha"),
    "lora_targets": ("--target_modules", "--ds.lora.target_modules"),
    "lora_dropout": ("--lora_dropout", "--ds.lora.dropout"),
    "load_in_4bit": ("--load_in_4bit", "--ds.load_in_4bit"),
    "packing": ("--packing_samples", "--ds.packing_samples"),
    "liger": ("--use_liger_kernel", "--ds.use_liger_kernel"),
    "overlap_comm": ("--overlap_comm", "--ds.overlap_comm"),
    "grad_accum_dtype": ("--grad_accum_dtype", "--ds.grad_accum_dtype"),
    "attention": ("--attn_implementation", "--ds.attn_implementation"),
    "param_dtype": ("--param_dtype", "--ds.param_dtype"),
    "ring": ("--ring_attn_size", "--ds.ring_attn_size"),
    "tensor_parallel": ("--ds_tensor_parallel_size", "--ds.tensor_parallel_size"),
    "pretrain_mode": ("--pretrain_mode", "--model.pretrain_mode_enable"),
    "zpg": ("--zpg", "--ds.zpg"),
    "ref_offload": ("--ref_offload", "--ref.offload"),  # train_dpo: offload_param of the reference (ZeRO-3)
}
# train_ppo_ray's own flags, and those it names apart from the other scripts (the actor's model and checkpointing,
# one offload switch for reference and reward before 0.10.2); None: that flag style has no such flag
PPO_FLAGS = {
    "model": ("--pretrain", "--actor.model_name_or_path"),
    "checkpointing": ("--gradient_checkpointing", "--actor.gradient_checkpointing_enable"),
    "reentrant": ("--gradient_checkpointing_use_reentrant", "--actor.gradient_checkpointing_reentrant"),
    "ref_offload": ("--ref_reward_offload", "--ref.offload"),
    "reward_offload": ("--ref_reward_offload", "--reward.offload"),
    "rollout_micro_batch": ("--micro_rollout_batch_size", "--rollout.micro_batch_size"),
    "reward_model": ("--reward_pretrain", "--reward.model_name_or_path"),
    "critic_model": ("--critic_pretrain", "--critic.model_name_or_path"),
    "remote_reward": ("--remote_rm_url", "--reward.remote_url"),
    "agent": ("--agent_func_path", "--train.agent_func_path"),
    "estimator": ("--advantage_estimator", "--algo.advantage.estimator"),
    "init_kl_coef": ("--init_kl_coef", "--algo.kl.init_coef"),
    "colocate_actor_ref": ("--colocate_actor_ref", "--train.colocate_actor_ref"),
    "colocate_critic_reward": ("--colocate_critic_reward", "--train.colocate_critic_reward"),
    "colocate_all": ("--colocate_all_models", "--train.colocate_all"),
    "vllm_engines": ("--vllm_num_engines", "--vllm.num_engines"),
    "vllm_tp": ("--vllm_tensor_parallel_size", "--vllm.tensor_parallel_size"),
    "vllm_gpu_memory_utilization": ("--vllm_gpu_memory_utilization", "--vllm.gpu_memory_utilization"),
    "vllm_sleep": ("--vllm_enable_sleep", "--vllm.enable_sleep"),
    "deepspeed_sleep": ("--deepspeed_enable_sleep", "--ds.enable_sleep"),
    "dynamic_batch": ("--use_dynamic_batch", "--train.dynamic_batch_enable"),
    "train_max_tokens": ("--train_max_tokens_per_gpu", "--train.max_tokens_per_gpu"),
    "rollout_max_tokens": ("--rollout_max_tokens_per_gpu", "--rollout.max_tokens_per_gpu"),
    "prompt_max_len": ("--prompt_max_len", None),
    "generate_max_len": ("--generate_max_len", None),
    "async": ("--async_train", "--train.async_enable"),
    **{f"{role}_{what}": (f"--{role}_{what}", f"--{role}.{what}") for role in ("actor", "ref", "critic", "reward")
       for what in ("num_nodes", "num_gpus_per_node")},
}
UNSUPPORTED_DEEPSPEED = ("reduce_bucket_size", "contiguous_gradients", "prefetch_bucket_size",
                         "param_persistence_threshold", "max_live_parameters", "sub_group_size", "ratio",
                         "offload_param", "zero3_init")


def flag_name(version: str, script: str, name: str) -> str | None:
    """The flag for `name` in this release, or None if that release has none."""
    candidate: str | None
    if name == "attention" and version == "0.8.9":
        candidate = "--flash_attn"
    elif name == "param_dtype" and version in ("0.8.9", "0.9.1"):
        candidate = "--bf16"
    else:
        legacy, dotted = (PPO_FLAGS if script == PPO and name in PPO_FLAGS else FLAGS)[name]
        candidate = dotted if version == "0.11.2" else legacy
    return candidate if candidate and candidate in flags_of(version, script) else None


def flags_of(version: str, script: str) -> dict:
    return table("openrlhf")["versions"][version][script]


# --- the command line, tokenized with positions --------------------------------------------------------

@dataclass
class Token:
    value: str  # shell-unquoted
    start: int
    end: int


@dataclass
class Command:
    script: str
    module: Token
    tokens: list[Token]
    flags: dict = field(default_factory=dict)  # flag -> True | value | [values], in order
    spans: dict = field(default_factory=dict)  # flag -> (flag token, [value tokens])
    multiline: bool = False
    fits: list = field(default_factory=list)  # every release whose parser knows all the flags


_END = set(";&|)\n")


def _tokens(text: str, i: int) -> tuple[list[Token], bool]:
    """Shell words from i to the end of the command (an unescaped newline, ;, &, |); quotes removed."""
    out, multiline = [], False
    n = len(text)
    while i < n:
        c = text[i]
        if c in " \t":
            i += 1
            continue
        if c == "\\" and text[i + 1:i + 2] == "\n":
            multiline = True
            i += 2
            continue
        if c in _END or c == "#":
            break
        start, value = i, []
        while i < n and text[i] not in " \t" and text[i] not in _END:
            c = text[i]
            if c == "\\" and text[i + 1:i + 2] == "\n":
                break
            if c in "'\"":
                close = text.find(c, i + 1)
                if close < 0:
                    raise ValueError(f"unclosed quote at character {i}")
                value.append(text[i + 1:close])
                i = close + 1
            elif c == "\\":
                value.append(text[i + 1:i + 2])
                i += 2
            else:
                value.append(c)
                i += 1
        out.append(Token("".join(value), start, i))
    return out, multiline


_MODULE = re.compile(r"openrlhf\.cli\.(train_[a-z_]+)")


def _find_module(text: str) -> re.Match | None:
    for m in _MODULE.finditer(text):
        line = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
        if "#" not in line:
            return m
    return None


def _convert(where: str, flag: str, spec: dict, raw: str):
    kind = spec.get("type", "str")
    if raw.startswith("$"):
        if kind in ("int", "float"):
            raise bad(where, flag, f"{raw} is a shell variable; memfit needs the number")
        return raw
    if kind == "int":
        return as_int(where, flag, raw)
    if kind == "float":
        try:
            return float(raw)
        except ValueError:
            raise bad(where, flag, f"expected a number, got {raw!r}") from None
    if "choices" in spec and spec["choices"] and raw not in spec["choices"]:
        raise bad(where, flag, f"expected one of {', '.join(spec['choices'])}; got {raw!r}")
    return raw


def detect_version(script: str, names: list[str]) -> tuple[str, list[str]]:
    """The newest release whose parser knows every flag; else the closest, with the unknown flags."""
    unknown = {version: [f for f in names if f not in flags_of(version, script)] for version in VERSIONS}
    best = min(VERSIONS, key=lambda version: len(unknown[version]))  # the first of the fewest: newest first
    return best, unknown[best]


def parse_command(text: str, where: str, version: str | None = None) -> tuple[Command, str]:
    m = _find_module(text)
    if m is None:
        raise bad(where, None, "no `openrlhf.cli.train_*` module in the command")
    script = m.group(1)
    if script not in METHODS:
        raise bad(where, None, f"openrlhf.cli.{script} is not modelled; memfit reads train_sft, train_dpo, train_rm, "
                  "train_ppo_ray")
    try:
        tokens, multiline = _tokens(text, m.end())
    except ValueError as e:
        raise bad(where, None, f"cannot read the command: {e}") from None
    names = [t.value.split("=", 1)[0] for t in tokens if t.value.startswith("--")]
    fits = [v for v in VERSIONS if all(f in flags_of(v, script) for f in names)]
    if version is None:
        version, unknown = detect_version(script, names)
        if unknown:
            known = flags_of(version, script)
            raise bad(where, unknown[0], f"unknown flag: OpenRLHF {RELEASES[version]} {script} rejects it"
                      f"{suggest(unknown[0], known)}")
    specs = flags_of(version, script)
    cmd = Command(script, Token(m.group(), m.start(), m.end()), tokens, multiline=multiline)
    cmd.fits = fits
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.value.startswith("--"):
            raise bad(where, tok.value, "unexpected word in the OpenRLHF command (a value without its flag?)")
        flag, eq, inline = tok.value.partition("=")
        if flag not in specs:
            raise bad(where, flag, f"unknown flag: OpenRLHF {RELEASES[version]} {script} rejects it{suggest(flag, specs)}")
        if flag in cmd.flags:
            raise bad(where, flag, "given twice (argparse keeps the last; say it once)")
        spec = specs[flag]
        i += 1
        if spec.get("action") in ("store_true", "store_false"):
            cmd.flags[flag], cmd.spans[flag] = True, (tok, [])
            continue
        nargs = spec.get("nargs")
        values: list[Token] = []
        if eq:
            values = [Token(inline, tok.start + len(flag) + 1, tok.end)]
        else:
            count = nargs if isinstance(nargs, int) else None
            while i < len(tokens) and not tokens[i].value.startswith("--") and (count is None or len(values) < count):
                values.append(tokens[i])
                i += 1
                if nargs is None:
                    break
        if not values and nargs != "*":
            raise bad(where, flag, "expects a value")
        converted = [_convert(where, flag, spec, v.value) for v in values]
        cmd.flags[flag] = converted if nargs is not None else converted[0]
        cmd.spans[flag] = (tok, values)
    return cmd, version


def _launcher(text: str, cmd: Command) -> dict:
    """GPU counts from the launcher: deepspeed --num_gpus/--num_nodes/--include, torchrun, CUDA_VISIBLE_DEVICES."""
    outside = text[:cmd.module.start] + " " + text[(cmd.tokens[-1].end if cmd.tokens else cmd.module.end):]
    world = {}
    per_node = None
    for pattern in (r"--num_gpus[= ](\d+)", r"--nproc_per_node[= ](\d+)", r"--nproc-per-node[= ](\d+)"):
        m = re.search(pattern, outside)
        if m:
            per_node = int(m.group(1))
    m = re.search(r"--include[= ]['\"]?[\w.-]+:([\d,]+)", outside) or re.search(r"CUDA_VISIBLE_DEVICES=['\"]?([\d,]+)",
                                                                              outside)
    if per_node is None and m:
        per_node = len(m.group(1).split(","))
    m = re.search(r"--(?:num_nodes|nnodes)[= ](\d+)", outside)
    nodes = int(m.group(1)) if m else None
    if per_node is not None:
        world["num_gpus"] = per_node * (nodes or 1)
    if nodes is not None:
        world["nodes"] = nodes
    return world
