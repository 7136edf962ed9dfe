"""What a causal LM's logits and loss hold per logit element, measured on the installed transformers' own code.

    python -m memfit.trace.loss_tail [family ...]            # prints the facts of the installed release
    python -m memfit.trace.loss_tail --toml [family ...]     # the same as a [transformers."X.Y.Z"] TOML block

For each family a one-layer model with labels runs forward and backward on the CPU under the Accountant.
The bytes that grow with tokens x vocabulary (the logits, their fp32 copy, a shifted copy, log_softmax's
output, their gradients) are isolated by the mixed difference over two token counts and two vocabularies:
every term that grows with only one of them (weights, their gradients, the layer's activations) cancels.
Reported per logit element, for the model in bf16 and in fp32, and for the bf16 model's forward under autocast
with CUDA's op lists (where a release's loss does not upcast by itself, autocast's cross entropy takes an fp32
copy and writes an fp32 log_softmax): the forward peak, what forward leaves alive
for backward, and the backward peak. Run it under another transformers release (its own venv; memfit's
trace package imports nothing of transformers') to get that release's facts: this is how the loss of older
releases, which upcast and copied the logits in the model's forward, is known rather than guessed.

`inplace_ce` repeats the step with the model's cross entropy replaced, where the model calls it, by a CPU
stand-in with the memory behaviour of the fused cross entropy that fms-acceleration's FOAK plugin patches in
(unsloth's Fast_CrossEntropyLoss, a GPU kernel): it keeps the logits it is given and one logsumexp per row, and
writes the gradient into the logits' own storage. What the model's own forward copies before the loss stays.
"""
from __future__ import annotations

import sys
import warnings
from contextlib import contextmanager

import torch

from memfit.trace.accountant import Accountant
from memfit.trace.autocast import CudaAutocastPolicy

ROWS = 2  # one row would hide the shifted copy: the slice of a single row is already contiguous
TOKENS = (64, 128)  # per row; small enough to run on a CPU in seconds
VOCABS = (4096, 8192)
HIDDEN, HEADS = 64, 4
# memfit arch (= the family's model_type) -> config arguments beyond the shared small sizes (Mistral is read as llama)
FAMILIES: dict[str, dict] = {
    "llama": {}, "qwen2": {}, "mixtral": {"num_local_experts": 2, "num_experts_per_tok": 1},
    "gemma": {"head_dim": 16}, "phi3": {}, "gpt_neox": {}, "opt": {"word_embed_proj_dim": HIDDEN},
    "gpt2": {}, "gpt_bigcode": {}, "falcon": {}, "bloom": {},
}
_SIZES = dict(hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=HEADS, num_key_value_heads=HEADS,
              intermediate_size=2 * HIDDEN, ffn_dim=2 * HIDDEN, n_embd=HIDDEN, n_layer=1, n_head=HEADS,
              max_position_embeddings=256, n_positions=256, pad_token_id=0)


def _model(family: str, vocab: int, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # the mapping is typed with the base config class, whose signature lacks each family's own sizes
    config = CONFIG_MAPPING[family](**_SIZES, **FAMILIES[family], vocab_size=vocab)  # type: ignore[call-arg, arg-type]
    config._attn_implementation = "eager"  # the attention does not grow with the vocabulary: any kernel will do
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config).to(dtype).train()


class _InPlaceCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, ignore_index):
        rows = logits.reshape(-1, logits.shape[-1])
        lse = torch.stack([torch.logsumexp(r.float(), -1) for r in rows])  # a row at a time: no logits-sized temporary
        valid = labels.reshape(-1) != ignore_index
        picked = rows.gather(1, labels.reshape(-1, 1).clamp(min=0)).squeeze(1).float()
        ctx.save_for_backward(rows, lse, labels.reshape(-1), valid)
        return ((lse - picked) * valid).sum() / valid.sum().clamp(min=1)

    @staticmethod
    def backward(ctx, grad):
        rows, lse, labels, valid = ctx.saved_tensors
        scale = (grad / valid.sum().clamp(min=1)).to(rows.dtype)
        for i in range(rows.shape[0]):  # softmax - onehot, written over the logits row by row
            rows[i].sub_(lse[i].to(rows.dtype)).exp_()
            rows[i, labels[i].clamp(min=0)] -= 1
            rows[i].mul_(scale * valid[i])
        return rows, None, None


def _inplace_ce(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                label_smoothing=0.0):
    if weight is not None or reduction != "mean" or label_smoothing:
        raise NotImplementedError("the in-place cross entropy stand-in models the plain mean loss only")
    return _InPlaceCrossEntropy.apply(input, target, ignore_index)


class _InPlaceCrossEntropyLoss(torch.nn.Module):
    def __init__(self, ignore_index=-100, reduction="mean", **_):
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, input, target):
        return _inplace_ce(input, target, ignore_index=self.ignore_index, reduction=self.reduction)


@contextmanager
def _patched_cross_entropy():
    """Where a release's model calls cross entropy: `F.cross_entropy` (transformers' loss functions) and the
    `CrossEntropyLoss` name each loaded modeling module imported (older releases) - FOAK's patch points."""
    import torch.nn.functional as F

    name = "CrossEntropyLoss"  # the class a modeling module imported under this name
    modules = [m for module_name, m in sys.modules.items()
               if module_name.startswith("transformers.models.") and hasattr(m, name)]
    saved = F.cross_entropy, [getattr(m, name) for m in modules]
    F.cross_entropy = _inplace_ce
    for m in modules:
        setattr(m, name, _InPlaceCrossEntropyLoss)
    try:
        yield
    finally:
        F.cross_entropy = saved[0]
        for m, original in zip(modules, saved[1]):
            setattr(m, name, original)


def _step(family: str, tokens: int, vocab: int, dtype: torch.dtype, inplace: bool = False,
          autocast: bool = False) -> tuple[int, int, int]:
    """(forward peak, alive after forward, backward peak) of the tracked bytes of one training step; `autocast`:
    the forward in a bf16 autocast region with CUDA's op lists, as HF Trainer's mixed precision runs it."""
    model = _model(family, vocab, dtype)
    ids = torch.randint(1, vocab, (ROWS, tokens))
    acc = Accountant()
    with (_patched_cross_entropy() if inplace else _no_patch()), CudaAutocastPolicy(), acc:
        acc.enter_phase("forward")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        after_forward = acc.live_bytes
        acc.enter_phase("backward")
        loss.backward()
    return acc.peaks["0:forward"].total, after_forward - loss.untyped_storage().nbytes(), acc.peaks["0:backward"].total


@contextmanager
def _no_patch():
    yield


def per_logit(family: str, dtype: torch.dtype, inplace: bool = False, autocast: bool = False) -> dict[str, float]:
    """Bytes per (token x vocabulary) element: the mixed difference of `_step` over TOKENS x VOCABS."""
    (n1, n2), (v1, v2) = TOKENS, VOCABS
    _model(family, VOCABS[0], dtype)  # imports the family's modeling module, so its names can be patched
    runs = {(n, v): _step(family, n, v, dtype, inplace, autocast) for n in TOKENS for v in VOCABS}
    mixed = [runs[n2, v2][i] - runs[n1, v2][i] - runs[n2, v1][i] + runs[n1, v1][i] for i in range(3)]
    area = ROWS * (n2 - n1) * (v2 - v1)
    return {k: round(m / area, 2) for k, m in zip(("forward_peak", "saved", "backward_peak"), mixed)}


def facts(families: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    return {f: {"bf16": per_logit(f, torch.bfloat16), "fp32": per_logit(f, torch.float32),
                "bf16_inplace_ce": per_logit(f, torch.bfloat16, True), "fp32_inplace_ce": per_logit(f, torch.float32, True),
                "bf16_autocast": per_logit(f, torch.bfloat16, autocast=True)}
            for f in families}


def to_toml(found: dict, version: str) -> str:
    """The release's block of data/loss_tail.toml; `covers` (the releases it stands for) is the reader's to set."""
    lines = [f'[transformers."{version}"]', f'covers = ["{version}", "{version}"]',
             f'torch = "{torch.__version__.split("+")[0]}"', f'[transformers."{version}".families]']
    for family, by_column in found.items():
        cells = ", ".join(f"{c} = [{v['forward_peak']}, {v['saved']}, {v['backward_peak']}]"
                          for c, v in by_column.items())
        lines.append(f"{family} = {{ {cells} }}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    import transformers

    as_toml = "--toml" in argv
    families = [a for a in argv if not a.startswith("--")] or list(FAMILIES)
    found = facts(families)
    if as_toml:
        print(to_toml(found, transformers.__version__), end="")
        return 0
    print(f"transformers {transformers.__version__}: bytes per logit element (forward peak / saved / backward peak)")
    for family, by_dtype in found.items():
        print(f"  {family:12s} " + "   ".join(f"{d}: {v['forward_peak']:>5} {v['saved']:>5} {v['backward_peak']:>5}"
                                            for d, v in by_dtype.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
