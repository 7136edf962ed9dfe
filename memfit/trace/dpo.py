"""DPO / IPO on fake tensors: the training step of OpenRLHF's DPOTrainer.

What one step does (openrlhf/trainer/dpo_trainer.py `fit`, models/actor.py `forward`, models/utils.py
`log_probs_from_logits`, models/loss.py `DPOLoss`), and so what this module runs:

1. `concatenated_inputs`: chosen and rejected ids and masks are `torch.cat`-ed into 2 x micro-batch rows.
2. The policy's forward (`Actor.forward`): position ids from the mask, the model without labels, then
   `output["logits"] = output["logits"].to(torch.float32)` (the 16-bit logits die at the reassignment),
   then flash_attn's triton `cross_entropy_loss` on the fp32 logits (OpenRLHF requires flash-attn); it saves
   the fp32 logits for backward. `_get_batch_logps` masks the prompts and sums per row.
3. The reference's forward on the same rows under `torch.no_grad()`, after the policy's, while the policy's
   saved activations and fp32 logits wait for backward: a separate frozen 16-bit model, which OpenRLHF loads
   with LoRA too (catalog/methods.toml lora_ref = "separate"; memfit.facts.methods.reference decides it for
   both the estimate and this trace).
4. `DPOLoss` (sigmoid, or IPO's square), backward, clip, optimizer step: the rest of `run._train_step`.

flash_attn's kernel needs a GPU, so `_CrossEntropy` stands in for it with the same outputs, saved set and
backward allocation (flash_attn/ops/triton/cross_entropy.py `CrossEntropyLoss`), like `cuda.py`'s attention.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from memfit.errors import MemfitError
from memfit.facts.methods import OPENRLHF_DPO_METHODS, framework_facts, reference
from memfit.facts.scenario import Scenario
from memfit.trace.accountant import Accountant
from memfit.trace.build import BuiltModel, build_model
from memfit.trace.cuda import _is_fake

BETA = 0.1  # openrlhf/cli/train_dpo.py --beta default
PROMPT_FRACTION = 4  # prompt tokens masked out of the log-prob sums: a quarter of each row (no memory effect)
LOGITS_KINDS = ("fp32_cast",)  # the frameworks' log-prob handling this module runs (catalog/methods.toml)


def reference_kind(scenario: Scenario) -> str:
    """'none', 'shared' (the policy with adapters disabled) or 'separate', as the framework holds it."""
    return reference(scenario)[0]


def check_supported(scenario: Scenario) -> None:
    fw = framework_facts(scenario.profile)
    if scenario.method not in OPENRLHF_DPO_METHODS:
        raise MemfitError(f"trace runs sft, pt, dpo and ipo steps; method {scenario.method!r} is not traced yet")
    if fw["logits"] not in LOGITS_KINDS:
        raise MemfitError(f"trace runs OpenRLHF's DPO step (fp32 logits, flash_attn cross entropy); profile "
                          f"{scenario.profile} computes log-probs as {fw['logits']!r}: trace with --profile openrlhf")
    if scenario.padding != "padded":
        raise MemfitError("trace runs OpenRLHF's DPO without --packing_samples: use --padding padded")
    if reference_kind(scenario) != "separate":
        raise MemfitError("trace runs DPO with a separate reference model (OpenRLHF's layout); reference "
                          "log-probs that are precomputed or come from the adapter-disabled policy are not traced")


def reference_scenario(scenario: Scenario) -> Scenario:
    """The reference as OpenRLHF's Actor(ref_pretrain, param_dtype=bf16) builds it: the same (or --ref-model)
    architecture, whole, in the 16-bit compute dtype, no adapters, no checkpointing."""
    from memfit.facts.catalog import find_model

    model = find_model(scenario.ref_model) if scenario.ref_model else scenario.model
    return scenario.with_changes(model=model, tuning="full", precision=scenario.precision.replace("mixed", "pure"),
                                 checkpointing="off", autocast=False, kbit_upcast=False, optimizer_in_backward=False,
                                 method="sft")


def build_reference(scenario: Scenario, fake_mode) -> BuiltModel:
    """The frozen reference on fake tensors, in eval mode (DPOTrainer.fit: self.ref_model.eval())."""
    ref = build_model(reference_scenario(scenario), device="cpu", fake_mode=fake_mode)
    ref.model.eval()
    for p in ref.model.parameters():
        p.requires_grad_(False)
    return ref


def prepare_policy(built: BuiltModel) -> None:
    """What OpenRLHF's Actor does to the policy beyond `build_model`: LoRA -> enable_input_require_grads
    (peft issue 137), MoE -> output_router_logits (the balancing loss is computed even at coefficient 0)."""
    if built.model is not built.hf_model:
        built.hf_model.enable_input_require_grads()
    if "output_router_logits" in built.hf_model.config.to_dict():
        built.hf_model.config.output_router_logits = True


# ---------------------------------------------------------------------------------------------- the batch
@dataclass
class PreferenceBatch:
    chosen_ids: torch.Tensor
    c_mask: torch.Tensor
    reject_ids: torch.Tensor
    r_mask: torch.Tensor
    prompt_id_lens: list[int]
    real_tokens: int | None  # flash unpadding over the concatenated rows (None = no padding)
    indices: torch.Tensor | None  # real runs: flattened positions of the real tokens


def preference_batch(scenario: Scenario, pad_tokens: int, fake: bool, acc: Accountant | None) -> PreferenceBatch:
    """The DPO collator's batch: chosen and rejected rows of seq_len tokens, the last rejected row right-padded by
    `pad_tokens` (chosen and rejected are padded to the longer of the two)."""
    rows, length = scenario.micro_batch, scenario.seq_len
    pads = max(0, min(pad_tokens, length - 1))
    vocab = scenario.model.vocab_size
    chosen, rejected = torch.randint(0, vocab, (rows, length)), torch.randint(0, vocab, (rows, length))
    c_mask = torch.ones((rows, length), dtype=torch.long)
    r_mask = torch.ones((rows, length), dtype=torch.long)
    if pads:
        r_mask[-1, length - pads:] = 0
    indices = None
    if pads and not fake and scenario.attention == "flash":
        with acc.paused() if acc is not None else nullcontext():
            indices = torch.nonzero(torch.cat((c_mask, r_mask)).flatten()).flatten()
    real = 2 * rows * length - pads if pads else None
    return PreferenceBatch(chosen, c_mask, rejected, r_mask, [length // PROMPT_FRACTION] * rows, real, indices)


# ---------------------------------------------------------------------------------------------- log-probs
@contextmanager
def _unseen():
    """Real values for real runs, computed where no memory counter (the trace's Accountant, measure's tracker,
    both dispatch modes) sees them: the CUDA kernel computes them in place, without these temporaries."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch.no_grad():
        yield


class _CrossEntropy(torch.autograd.Function):
    """flash_attn.ops.triton.cross_entropy.CrossEntropyLoss (inplace_backward=False) as memory sees it: fp32
    losses, lse and z_losses of one value per row; saves the logits it was given; backward allocates
    dlogits = empty_like(logits)."""

    @staticmethod
    def forward(ctx, logits, labels):
        logits = logits if logits.stride(-1) == 1 else logits.contiguous()
        n = logits.shape[0]
        losses, lse, z_losses = (logits.new_empty((n,), dtype=torch.float32) for _ in range(3))
        if not _is_fake(logits):
            with _unseen():
                lse.copy_(torch.logsumexp(logits.float(), -1))
                losses.copy_(lse - logits.float().gather(-1, labels[:, None])[:, 0])
                z_losses.zero_()
        ctx.save_for_backward(logits, lse, labels)
        ctx.mark_non_differentiable(z_losses)
        return losses, z_losses

    @staticmethod
    def backward(ctx, grad_losses, grad_z_losses):
        logits, lse, labels = ctx.saved_tensors
        dlogits = torch.empty_like(logits)
        if not _is_fake(logits):
            with _unseen():
                probs = torch.exp(logits.float() - lse[:, None])
                probs[torch.arange(len(labels)), labels] -= 1
                dlogits.copy_(probs * grad_losses[:, None])
        return dlogits, None


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """openrlhf/models/utils.py, fp32 branch with flash_attn installed (temperature 1)."""
    batch_dim, last_dim = logits.shape[:-1], logits.shape[-1]
    output = _CrossEntropy.apply(logits.reshape(-1, last_dim), labels.reshape(-1))
    return -output[0].view(*batch_dim)


def _batch_logps(per_token_logps, attention_mask, prompt_id_lens):
    """DPOTrainer._get_batch_logps: (sum, mean) of the response tokens' log-probs per row."""
    loss_masks = attention_mask.clone().bool()
    for mask, source_len in zip(loss_masks, prompt_id_lens):
        mask[:source_len] = False
    loss_masks = loss_masks[:, 1:]
    sums = (per_token_logps * loss_masks).sum(-1)
    means = (per_token_logps * loss_masks).sum(-1) / loss_masks.sum(-1)
    return sums, means


def concatenated_forward(model, batch: PreferenceBatch):
    """DPOTrainer.concatenated_forward + Actor.forward(return_output=True, return_logprobs=True)."""
    sequences = torch.cat((batch.chosen_ids, batch.reject_ids), dim=0)
    attention_mask = torch.cat((batch.c_mask, batch.r_mask), dim=0)
    rolled = torch.roll(sequences, shifts=-1, dims=1)
    position_ids = attention_mask.long().cumsum(-1) - 1
    position_ids.masked_fill_(attention_mask == 0, 1)
    output = model(sequences, attention_mask=attention_mask, position_ids=position_ids)
    output["logits"] = output["logits"].to(torch.float32)
    log_probs = log_probs_from_logits(output["logits"], rolled)[:, :-1]
    sums, means = _batch_logps(log_probs, attention_mask, batch.prompt_id_lens * 2)
    rows = batch.chosen_ids.shape[0]
    return sums[:rows], sums[rows:], -means[:rows].mean()


def dpo_loss(chosen, rejected, ref_chosen, ref_rejected, ipo: bool) -> torch.Tensor:
    """openrlhf/models/loss.py DPOLoss (label_smoothing 0); the rewards it also returns are detached scalars."""
    logits = (chosen - rejected) - (ref_chosen - ref_rejected)
    losses = (logits - 1 / (2 * BETA)) ** 2 if ipo else -F.logsigmoid(BETA * logits)
    return losses.mean()


def forward_loss(acc: Accountant, built: BuiltModel, reference: BuiltModel, batch: PreferenceBatch,
                 scenario: Scenario) -> torch.Tensor:
    """The forward part of one DPOTrainer step: the policy, then the reference under no_grad, then the loss."""
    chosen, rejected, _nll = concatenated_forward(built.model, batch)  # nll_loss_coef 0: computed, not used
    acc.region = "activations"  # the reference's layers; its lm_head hook switches to logits_loss
    with torch.no_grad():
        ref_chosen, ref_rejected, _ = concatenated_forward(reference.model, batch)
    return dpo_loss(chosen, rejected, ref_chosen, ref_rejected, scenario.method == "ipo")
