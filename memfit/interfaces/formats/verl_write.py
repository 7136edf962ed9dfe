"""`memfit fit` on a verl launch: the overrides a plan changes, edited in the script's own text and nothing else.

What memfit writes is a memory setting: the actor's / critic's offload switches, the reference's parameter offload,
micro-batches (or, under use_dynamic_bsz, the token budgets that stand for them), the rollout's
gpu_memory_utilization and free_cache_engine, gradient checkpointing, remove-padding and the entropy switches.
The run's shape (algorithm, roles and their models, GPUs, rollout tensor parallelism, lengths, rollout.n) is the
user's and is never rewritten.

An override the script states is edited where it is written: the value after `key=` in the word, whether that word
is on the command line or in a bash array the command expands (a value taken from a variable becomes the literal);
every word that sets the key is edited, so they agree. A key the script does not state is added right after
`verl.trainer.main_ppo`, on its own line when the command spans lines. The result is read back and must say
what was asked (base.verify_written)."""
from __future__ import annotations

import re

from memfit.interfaces.formats.base import ImportedConfig, cannot, changed_knobs, verify_written

A = "actor_rollout_ref."
SWITCHES = {"param_offload": [A + "actor.fsdp_config.param_offload"],
            "optimizer_offload": [A + "actor.fsdp_config.optimizer_offload"],
            "ref_offload": [A + "ref.fsdp_config.param_offload"],
            "critic_param_offload": ["critic.fsdp.param_offload"],
            "critic_optimizer_offload": ["critic.fsdp.optimizer_offload"],
            "vllm_sleep": [A + "rollout.free_cache_engine"],
            "remove_padding": [A + "model.use_remove_padding"],
            "entropy_chunking": [A + "actor.entropy_from_logits_with_chunking"],
            "entropy_checkpointing": [A + "actor.entropy_checkpointing"]}
VALUES = {"vllm_gpu_memory_utilization": [A + "rollout.gpu_memory_utilization"],
          "ppo_max_token_len": [A + "actor.ppo_max_token_len_per_gpu"],
          "log_prob_max_token_len": [A + "rollout.log_prob_max_token_len_per_gpu", A + "ref.log_prob_max_token_len_per_gpu"]}
# the run's shape: read, never rewritten
SHAPE = frozenset({"method", "tuning", "lora_rank", "lora_alpha", "lora_targets", "vllm_tp", "vllm_engines",
                   "role_gpus", "colocate", "critic_model", "reward_model", "remote_reward", "init_kl_coef",
                   "seq_len", "response_len", "rollout_n", "engine", "fsdp_version", "dynamic_bsz"})


def _render(value) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return repr(value) if isinstance(value, float) else str(value)


def edits_of(imported: ImportedConfig, changes: dict) -> dict[str, object]:
    """config key -> new value for the knob changes (one line refusing a knob memfit keeps or verl cannot say)."""
    k = imported.knobs
    out: dict[str, object] = {}
    for knob, value in changes.items():
        if knob in SWITCHES:
            out.update(dict.fromkeys(SWITCHES[knob], bool(value)))
        elif knob in VALUES:
            out.update(dict.fromkeys(VALUES[knob], value))
        elif knob == "checkpointing":
            if value not in ("full", "off"):
                raise cannot(imported, knob, value, "verl has full gradient checkpointing or none "
                             "(model.enable_gradient_checkpointing)")
            out[A + "model.enable_gradient_checkpointing"] = value == "full"
        elif knob == "padding":
            if value == "packed":
                raise cannot(imported, knob, value, "verl unpads rows (model.use_remove_padding) or pads them")
            out[A + "model.use_remove_padding"] = value == "padding_free"
        elif knob == "micro_batch":
            out.update(_micro_batch(imported, value, changes.get("seq_len", k["seq_len"])))
        elif knob == "rollout_micro_batch":
            out.update(_log_prob_batch(imported, value))
        elif knob == "grad_accum":
            continue  # verl derives it from ppo_mini_batch_size / micro-batch: checked when read back
        elif knob in SHAPE:
            raise cannot(imported, knob, value, "memfit keeps verl's algorithm, roles, GPUs, rollout parallelism "
                         "and lengths as the launch has them; edit the launch by hand")
        else:
            raise cannot(imported, knob, value, "verl's ppo_trainer config has no key memfit writes for it")
    return out


def _micro_batch(imported: ImportedConfig, rows: int, seq: int) -> dict:
    """The actor's micro-batch (its token budget under use_dynamic_bsz), and the critic's with it: memfit runs the
    critic on the actor's micro-batch, so a critic left larger would be memory the plan does not count."""
    cfg, out = imported.doc[1], {}
    for role, switch in ((A + "actor", A + "actor.use_dynamic_bsz"), ("critic", "critic.use_dynamic_bsz")):
        if role == "critic" and imported.knobs["method"] != "ppo":
            continue
        if cfg.get(switch):  # the budget that reads back as `rows` whole rows
            out[f"{role}.ppo_max_token_len_per_gpu"] = rows * seq
        elif cfg.get(f"{role}.ppo_micro_batch_size") is not None:
            raise cannot(imported, "micro_batch", rows, f"the launch sets the deprecated global {role}."
                         f"ppo_micro_batch_size; state {role}.ppo_micro_batch_size_per_gpu instead")
        else:
            out[f"{role}.ppo_micro_batch_size_per_gpu"] = rows
    return out


def _log_prob_batch(imported: ImportedConfig, rows: int) -> dict:
    cfg, out = imported.doc[1], {}
    seq = imported.knobs["seq_len"]
    for role in ("rollout", "ref"):
        if cfg.get(f"{A}{role}.log_prob_use_dynamic_bsz"):
            out[f"{A}{role}.log_prob_max_token_len_per_gpu"] = rows * seq
        elif cfg.get(f"{A}{role}.log_prob_micro_batch_size") is not None:
            raise cannot(imported, "rollout_micro_batch", rows, f"the launch sets the deprecated global "
                         f"{role}.log_prob_micro_batch_size; state {role}.log_prob_micro_batch_size_per_gpu instead")
        else:
            out[f"{A}{role}.log_prob_micro_batch_size_per_gpu"] = rows
    return out


# --- the text ----------------------------------------------------------------------------------------------

def _word_end(text: str, i: int) -> int:
    """Where the shell word running through position i ends (quotes and `\\x` kept inside it)."""
    while i < len(text):
        c = text[i]
        if c in " \t\n;)|&":
            return i
        if c in "'\"":
            close = text.find(c, i + 1)
            i = len(text) if close < 0 else close + 1
        else:
            i += 2 if c == "\\" else 1
    return i


def _value_spans(text: str, key: str) -> list[tuple[int, int]]:
    """(start, end) of the value of every word that sets `key` (key=, +key=, ++key=), outside comments."""
    spans = []
    for m in re.finditer(r"(?<![\w.\-])\+{0,2}" + re.escape(key) + "=", text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        before = text[line_start:m.start()]
        if "#" in before.split("'")[0].split('"')[0]:
            continue  # a comment
        opener = before[-1:] if before[-1:] in "'\"" else ""
        end = text.find(opener, m.end()) if opener else _word_end(text, m.end())
        spans.append((m.end(), len(text) if end < 0 else end))
    return spans


def _insert(imported: ImportedConfig, text: str, words: list[str]) -> str:
    """The new overrides right after the main_ppo module of the launch's command."""
    launch = imported.doc[0]
    start = sum(len(x) + 1 for x in text.split("\n")[:launch.line - 1])
    m = re.compile(r"verl\.trainer\.main_ppo|verl/trainer/main_ppo\.py").search(text, start)
    if m is None:
        raise cannot(imported, "overrides", words, "internal error: the main_ppo command is not where it was read")
    after = text[m.end():]
    continued = re.match(r"[ \t]*\\\n([ \t]*)", after)
    if continued:
        indent = continued.group(1) or "    "
        added = "".join(f" \\\n{indent}{w}" for w in words)
    else:
        added = "".join(f" {w}" for w in words)
    return text[:m.end()] + added + text[m.end():]


def edit_text(imported: ImportedConfig, edits: dict) -> str:
    text, edits_at, missing = imported.text, [], []
    for key, value in edits.items():
        spans = _value_spans(text, key)
        if not spans:
            missing.append(f"{key}={_render(value)}")
        edits_at += [(s, e, _render(value)) for s, e in spans]
    for s, e, new in sorted(edits_at, reverse=True):
        text = text[:s] + new + text[e:]
    return _insert(imported, text, missing) if missing else text


def write(imported: ImportedConfig, knobs: dict, read) -> str:
    """The launch's new text; `read` (verl.read) reads it back."""
    changes = changed_knobs(imported, knobs)
    changes = {k: v for k, v in changes.items() if not (k not in imported.knobs and v is None)}
    edits = edits_of(imported, changes)
    text = edit_text(imported, edits) if edits else imported.text
    num_gpus = imported.world.get("num_gpus")
    again = read(text, gpus=num_gpus, path=imported.path)
    verify_written(imported, again, {k: v for k, v in changes.items() if k in again.knobs})
    return text
