"""Log-prob memory of older TRL DPO releases, from running their op sequence on small CPU tensors.

memfit's pinned TRL computes DPO log-probs inside the lm_head in tiles (methods.toml [logits.trl_fused]).
Older releases did it on the model's full logits; data/releases.toml says which release did what and where
it was read. Each function below replays one release's ops in that order (written from reading the code, not
copied): the model's logits (16-bit from lm_head, cast to fp32 in the model's forward before transformers
4.46), then TRL's log-prob computation, then the sum per row the loss uses.

`traced_counts` runs one of them with a counting dispatch mode and returns how many token x vocab copies of
each dtype were alive at the forward peak, after the forward (saved for backward), at the backward peak and
at a no-grad forward's peak: the numbers methods.toml stores for that kind (tests/trace/test_release_logps.py
checks them against this trace, so the table cannot drift from the ops).
"""
from __future__ import annotations

import weakref
from functools import partial

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROWS, POSITIONS, VOCAB, HIDDEN = 2, 64, 2048, 4  # hidden tiny so its grads are noise next to token x vocab


def log_softmax_gather(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL < 0.15 get_batch_logps: drop the last position, a full log_softmax, gather the labels, sum per row.
    concatenated_forward returns the logits too (for metrics): they stay referenced through the reference's
    forward until the loss is computed."""
    shifted = logits[:, :-1, :]
    per_token = torch.gather(shifted.log_softmax(-1), dim=2, index=labels[:, 1:].unsqueeze(2)).squeeze(2)
    return per_token.sum(-1), logits


def selective(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL 0.15 - 1.9 _compute_loss (as in v1.9.0): the shifted logits as a view, then selective_log_softmax:
    16-bit logits -> a log_softmax per row (a loop, to bound the peak); fp32 -> gather minus a per-row logsumexp.
    The model's output (its logits) stays referenced through the reference's forward until the loss."""
    shifted = logits[..., :-1, :]
    index = labels[:, 1:].unsqueeze(-1)
    if shifted.dtype == torch.float32:
        picked = torch.gather(shifted, dim=-1, index=index)
        norm = torch.stack([torch.logsumexp(row, dim=-1) for row in shifted])
        per_token = (picked - norm.unsqueeze(-1)).squeeze(-1)
    else:
        per_token = torch.stack([F.log_softmax(row, dim=-1).gather(-1, idx) for row, idx in zip(shifted, index)])
        per_token = per_token.squeeze(-1)
    return per_token.sum(-1), logits


KINDS = {"trl_log_softmax": (log_softmax_gather, False), "trl_log_softmax_fp32": (log_softmax_gather, True),
         "trl_selective": (selective, False), "trl_selective_fp32": (selective, True)}


class _Counter(TorchDispatchMode):
    """Live bytes per dtype of the storages ops create, and the split at the highest total."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[torch.dtype, int]] = {}
        self._refs: dict[int, weakref.ref] = {}
        self.peak: dict[torch.dtype, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self.live:
            return
        self.live[key] = (t.dtype, st.nbytes())
        self._refs[key] = weakref.ref(st, partial(self._forget, key))
        now = self.split()
        if sum(now.values()) > sum(self.peak.values()):
            self.peak = now

    def _forget(self, key: int, _storage_ref: weakref.ref) -> None:
        """The storage is gone: it holds no bytes any more."""
        self.live.pop(key, None)
        self._refs.pop(key, None)

    def split(self) -> dict[torch.dtype, int]:
        out: dict[torch.dtype, int] = {}
        for dtype, n in self.live.values():
            out[dtype] = out.get(dtype, 0) + n
        return out

    def reset_peak(self) -> None:
        self.peak = self.split()


def _copies(split: dict[torch.dtype, int]) -> dict[str, float]:
    """Bytes per dtype -> copies of a rows x positions x vocab tensor (0.25 steps: a row's share is 1/ROWS)."""
    unit = ROWS * POSITIONS * VOCAB
    lowp = split.get(torch.bfloat16, 0) / (2 * unit)
    fp32 = split.get(torch.float32, 0) / (4 * unit)
    return {"lowp": round(lowp * 4) / 4, "fp32": round(fp32 * 4) / 4}


def _forward(fn, upcast: bool, hidden, weight, labels):
    logits = hidden @ weight.t()  # lm_head: 16-bit logits
    if upcast:
        logits = logits.float()  # transformers < 4.46: the CausalLM forward returned fp32 logits
    return fn(logits, labels)


def traced_counts(kind: str) -> dict[str, dict[str, float]]:
    """Copies of token x vocab per dtype at each point of one DPO log-prob step with `kind`'s ops."""
    fn, upcast = KINDS[kind]
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(ROWS, POSITIONS, HIDDEN, generator=gen, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(VOCAB, HIDDEN, generator=gen, dtype=torch.bfloat16)  # frozen head: no weight grad
    labels = torch.randint(0, VOCAB, (ROWS, POSITIONS), generator=gen)
    out = {}
    with _Counter() as c:
        logps, kept = _forward(fn, upcast, hidden, weight, labels)
        out["forward"] = _copies(c.peak)
        out["saved"] = _copies(c.split())  # autograd's saved tensors + what TRL keeps referenced
        del kept  # the loss is computed; compute_loss returns before backward
        c.reset_peak()
        logps.sum().backward()
        out["backward"] = _copies(c.peak)
        del logps
        c.reset_peak()
        with torch.no_grad():
            ref = _forward(fn, upcast, hidden.detach(), weight, labels)
        out["nograd"] = _copies(c.peak)
        del ref
    return out


if __name__ == "__main__":  # the counts for data/methods.toml, one [logits.KIND] table each
    for name in KINDS:
        print(f"[logits.{name}]")
        for point, copies in traced_counts(name).items():
            for dtype, count in copies.items():
                if count:
                    print(f"{point}_{dtype} = {count:g}")
