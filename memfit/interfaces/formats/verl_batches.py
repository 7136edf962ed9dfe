"""A verl launch's micro-batches, as verl 0.9.1 sets them (verl/workers/config/actor.py __post_init__ and
validate, workers/engine_workers.py): per GPU, the update runs ppo_mini_batch_size x rollout.n rows over
n_gpus / ulysses_sequence_parallel_size data-parallel ranks, ppo_micro_batch_size_per_gpu rows at a time (the
deprecated global ppo_micro_batch_size is divided by those ranks); the log-prob passes (the actor's old log-probs
in the rollout worker, the reference's) take log_prob_micro_batch_size_per_gpu rows. Under use_dynamic_bsz a
micro-batch is packed up to ppo_max_token_len_per_gpu tokens (log-prob passes: log_prob_max_token_len_per_gpu),
read here as whole rows of the full sequence, rounded up (a guess high: a packed micro-batch holds at most that
many tokens, and memfit's rows are all full length)."""
from __future__ import annotations

from memfit.interfaces.formats.base import bad

A = "actor_rollout_ref."


def _ranks(r) -> int:
    gpus = r.need("trainer.n_gpus_per_node", int, 1) * r.need("trainer.nnodes", int, 1)
    sp = r.get(A + "actor.ulysses_sequence_parallel_size", int) or 1
    return max(1, gpus // sp)


def _rows(budget: int, seq: int) -> int:
    return max(1, -(-budget // seq))


def batches(r) -> None:
    """micro_batch, grad_accum, rollout_micro_batch and the token budgets onto r.knobs (r: verl.Reader)."""
    k, g = r.knobs, r.get
    ranks, seq = _ranks(r), k["seq_len"]
    mini = r.need(A + "actor.ppo_mini_batch_size", int, 1) * k["rollout_n"]
    mini_per_gpu = max(1, mini // ranks)
    k["dynamic_bsz"] = bool(g(A + "actor.use_dynamic_bsz", bool))
    k["ppo_max_token_len"] = r.need(A + "actor.ppo_max_token_len_per_gpu", int, 1)
    if k["dynamic_bsz"]:
        k["micro_batch"] = min(_rows(k["ppo_max_token_len"], seq), mini_per_gpu)  # no more than a GPU's rows
        r.assumed.append(f"{A}actor.use_dynamic_bsz: {k['ppo_max_token_len']} tokens per GPU per micro-batch, read "
                         f"as {k['micro_batch']} packed rows of {seq} tokens (a GPU has {mini_per_gpu} per update)")
    else:
        k["micro_batch"] = _micro(r, A + "actor.ppo_micro_batch_size", ranks)
    k["grad_accum"] = max(1, -(-mini_per_gpu // k["micro_batch"]))
    if k["method"] == "ppo":
        _critic(r, ranks, seq)
    batch_per_gpu = max(1, r.need("data.train_batch_size", int, 1) * k["rollout_n"] // ranks)
    _log_prob(r, ranks, seq, batch_per_gpu)


def _micro(r, key: str, ranks: int) -> int:
    """`key`_per_gpu, else the deprecated global `key` over the data-parallel ranks; neither is verl's own error."""
    per_gpu, whole = r.get(key + "_per_gpu", int), r.get(key, int)
    if per_gpu is not None and whole is not None:
        raise bad(r.where, key, f"both {key} and {key}_per_gpu are set; verl refuses both (keep _per_gpu)")
    if per_gpu is not None:
        if per_gpu < 1:
            raise bad(r.where, key + "_per_gpu", f"must be at least 1, got {per_gpu}")
        return per_gpu
    if whole is not None:
        if whole < 1:
            raise bad(r.where, key, f"must be at least 1, got {whole}")
        r.assumed.append(f"{key} {whole} (deprecated, global) = {max(1, whole // ranks)} per GPU over {ranks} ranks")
        return max(1, whole // ranks)
    raise bad(r.where, key + "_per_gpu", "not set, and use_dynamic_bsz is off: verl refuses the run (set "
              f"{key}_per_gpu)")


def _log_prob(r, ranks: int, seq: int, batch_per_gpu: int) -> None:
    """The rollout's and the reference's log-prob micro-batches: the larger of the two (both run on every GPU)."""
    k, g = r.knobs, r.get
    rows, budgets = [], []
    for role in ("rollout", "ref"):
        if g(f"{A}{role}.log_prob_use_dynamic_bsz", bool):
            budget = r.need(f"{A}{role}.log_prob_max_token_len_per_gpu", int, 1)
            budgets.append(budget)
            rows.append(min(_rows(budget, seq), batch_per_gpu))
        elif g(f"{A}{role}.log_prob_micro_batch_size_per_gpu", int) is not None or \
                g(f"{A}{role}.log_prob_micro_batch_size", int) is not None:
            rows.append(_micro(r, f"{A}{role}.log_prob_micro_batch_size", ranks))
    if budgets:
        k["log_prob_max_token_len"] = max(budgets)
    if not rows:
        rows = [k["micro_batch"]]
        r.assumed.append("log-prob micro-batch: none set, read as the update's micro-batch")
    k["rollout_micro_batch"] = max(rows)


def critic_rows(r, ranks: int, seq: int) -> int:
    """The critic's micro-batch in rows (its own keys: critic.ppo_micro_batch_size_per_gpu, or its token budget
    under critic.use_dynamic_bsz, which follows the actor's switch by default)."""
    mini = r.need("critic.ppo_mini_batch_size", int, 1) * r.knobs["rollout_n"]
    if r.get("critic.use_dynamic_bsz", bool):
        return min(_rows(r.need("critic.ppo_max_token_len_per_gpu", int, 1), seq), max(1, mini // ranks))
    whole = r.get("critic.ppo_micro_batch_size", int)  # its _per_gpu interpolates it: the global one decides
    if whole is not None:
        return max(1, whole // ranks)
    return r.need("critic.ppo_micro_batch_size_per_gpu", int, 1)


def _critic(r, ranks: int, seq: int) -> None:
    """memfit runs the critic on the actor's micro-batch: a larger one of its own is memory it leaves out."""
    rows, actor = critic_rows(r, ranks, seq), r.knobs["micro_batch"]
    if rows > actor:
        r.unread("critic.ppo_micro_batch_size_per_gpu", "low", f"the critic's micro-batch of {rows} rows, more than "
                 f"the actor's {actor}", "the critic on the actor's micro-batch: its activations TOO LOW")
    elif rows < actor:
        r.assumed.append(f"the critic's micro-batch ({rows} rows) read as the actor's {actor} (guess high)")
