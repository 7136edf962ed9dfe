"""Make a CPU trace allocate what the same step allocates on a CUDA GPU.

The model code is device-agnostic except where the device picks a kernel. Those places, and what
this module does about them:

* `F.scaled_dot_product_attention` picks a kernel per device. On CUDA (torch 2.x,
  aten/src/ATen/native/transformers/cuda/sdp_utils.cpp `select_sdp_backend`) the order is
  cuDNN (sm90/sm100 only, newer torch), FlashAttention-2, memory-efficient, math. Flash needs no
  `attn_mask`, fp16/bf16 and head_dim <= 256; transformers passes no mask exactly when the batch has
  no padding (masking_utils `_ignore_causal_mask_sdpa`), and then `enable_gqa=True`. With a padding
  mask transformers repeats K/V to all heads and SDPA converts the bool mask to an additive mask in
  the query dtype (attention.cpp `convert_boolean_attn_mask`, B x 1 x T x T), which the
  memory-efficient kernel saves for backward. `cuda_sdpa` replaces the function for the trace,
  picks the backend by the same rules and runs an autograd.Function that allocates and saves exactly
  what the CUDA kernel does (output in B,T,H,D layout, fp32 logsumexp, the backward workspaces),
  computing real values only when the tensors are real.
* FlashAttention-2 (`attn_implementation="flash_attention_2"`) needs the flash_attn package and a GPU.
  `register_flash` registers memfit's stand-in under transformers' AttentionInterface: the same
  wrapper steps as transformers' `flash_attention_forward` (transpose to B,T,H,D, fp32 -> autocast
  dtype cast, unpad with a fresh index tensor per layer when the batch is padded, pad the output back)
  around an autograd.Function with flash_attn's saved set: q, k, v, out, fp32 softmax_lse, rng_state.
* Dropout with 0 < p < 1 is `native_dropout` on CUDA (output + bool mask saved) but a multiply by a
  noise tensor in the input dtype on the CPU (ATen Dropout.cpp `is_fused_kernel_acceptable`);
  `F.dropout` takes the CUDA route during the trace.
* Autocast: CPU autocast casts matmuls/linear to bf16 like CUDA autocast, but its fp32 lists are not CUDA's
  (layer_norm, softmax without dtype=, pow, rsqrt, sum stay 16-bit on the CPU); `autocast.CudaAutocastPolicy`
  applies the rest of CUDA's lists, read from torch's own autocast_mode.h. Code that asks
  `torch.is_autocast_enabled()` without a device means CUDA; during the trace it answers for the CPU region that
  stands in for it.
"""
from __future__ import annotations

import math
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from memfit.errors import MemfitError
from memfit.trace.accountant import Accountant
from memfit.trace.autocast import CudaAutocastPolicy

_ORIG_SDPA = F.scaled_dot_product_attention
_ORIG_DROPOUT = F.dropout
_ORIG_IS_AUTOCAST = torch.is_autocast_enabled
FLASH_NAME = "memfit_fa2"  # no "flash" in the name: transformers would look for the flash_attn package


@dataclass
class CudaTarget:
    """What of the GPU changes kernel choice."""

    compute_capability: float = 8.0
    # torch >= 2.10 puts cuDNN attention first on sm90/sm100 (sdp_utils.cpp check_prefer_cudnn_attention)
    prefer_cudnn: bool = False

    @classmethod
    def for_gpu(cls, gpu) -> "CudaTarget":
        cc = float(getattr(gpu, "compute_capability", 8.0))
        # assumes a torch/cuDNN pair new enough for the preference (cuDNN > 9.15); minor 0 or 3 as for CUDA 12 wheels
        return cls(cc, prefer_cudnn=cc in (9.0, 10.0, 10.3))


@dataclass
class _State:
    target: CudaTarget
    accountant: Accountant | None = None  # to hide reference math in real runs
    unpad_tokens: int | None = None  # flash: real tokens when the batch is padded (None = no padding)
    batch_indices: torch.Tensor | None = None  # real runs: which flattened positions are real tokens
    kernels: Counter = field(default_factory=Counter)  # attention kernels used, for the report


_STATE: _State | None = None


def _is_fake(*ts) -> bool:
    return any(isinstance(t, FakeTensor) for t in ts)


@contextmanager
def _hidden():
    acc = _STATE.accountant if _STATE else None
    if acc is None:
        yield
    else:
        with acc.paused():
            yield


def _round(x: int, m: int) -> int:
    return -(-x // m) * m


# ---------------------------------------------------------------------------------------------- backend choice
def _heads_ok(q, k, v, enable_gqa: bool) -> bool:
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if hq == hk == hv:
        return True
    return enable_gqa and hq % hk == 0 and hq % hv == 0


def sdpa_backend(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa, target: CudaTarget) -> str:
    """torch's `select_sdp_backend` for a CUDA device with `target`'s compute capability."""
    cc = target.compute_capability
    low = q.dtype in (torch.float16, torch.bfloat16) and (q.dtype == torch.float16 or cc >= 8.0)
    d, dv = q.shape[-1], v.shape[-1]
    heads = _heads_ok(q, k, v, enable_gqa) and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    heads = heads and (attn_mask is None or attn_mask.stride(-1) == 1)  # check_last_dim_stride_equals_1_dense
    requires_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)

    def cudnn_ok():
        if not (target.prefer_cudnn and low and heads and d % 8 == 0 and dv % 8 == 0):
            return False
        if dropout_p * 16 != math.floor(dropout_p * 16) or k.shape[-2] == 1:
            return False
        if not (d <= 256 and dv <= 256):
            return False
        return not requires_grad or (d <= 128 and dv <= 128) or (d, dv) in ((192, 128), (256, 256))

    def flash_ok():
        if attn_mask is not None or not low or not heads or cc < 8.0 or not (d == dv == k.shape[-1] <= 256):
            return False
        consumer = 8.6 <= cc <= 8.9 or 12.0 <= cc <= 12.1
        if requires_grad and consumer and not (d <= 192 or (dropout_p == 0 and d > 224)):
            return False
        return not (is_causal and q.shape[-2] != k.shape[-2])

    def efficient_ok():
        bits = 16 if q.dtype in (torch.float16, torch.bfloat16) else 32
        align = max(4 if cc >= 8.0 else 1, 128 // bits) if cc >= 7.0 else 1
        if q.dtype == torch.bfloat16 and cc < 8.0:
            return False
        return heads and d == k.shape[-1] and d % align == 0 and dv % align == 0

    checks = {"cudnn": cudnn_ok, "flash": flash_ok, "efficient": efficient_ok}
    order = ("cudnn", "flash", "efficient") if target.prefer_cudnn else ("flash", "efficient")
    for name in order:
        if checks[name]():
            return name
    return "math"


# ---------------------------------------------------------------------------------------------- fused kernels
def _reference_attention(q, k, v, bias, is_causal, scale, gqa):
    """Real values for real (non-fake) runs, computed outside the accountant's view."""
    mask = bias
    return _ORIG_SDPA(q, k, v, attn_mask=mask, is_causal=is_causal and mask is None, scale=scale,
                      enable_gqa=gqa and q.shape[-3] != k.shape[-3])


def _empty_bthd(like: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """An output the CUDA kernels allocate as (B, T, H, D) and return transposed to (B, H, T, D)."""
    b, _, t, _ = like.shape
    return like.new_empty((b, t, heads, dim)).transpose(1, 2)


class _FusedSDPA(torch.autograd.Function):
    """One SDPA kernel call on CUDA, as memory sees it (forward outputs, saved set, backward workspaces)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, is_causal, scale, backend, gqa):
        b, h, t, _ = q.shape
        dv = v.shape[-1]
        if backend == "cudnn":
            # cuDNN allocates the output with q's layout (alloc_with_matching_layout)
            out = torch.empty_like(q) if dv == q.shape[-1] else _empty_bthd(q, h, dv)
            lse = q.new_empty((b, h, t, 1), dtype=torch.float32)
        else:
            out = _empty_bthd(q, h, dv)
            lse_len = t if backend == "flash" else _round(t, 32)  # mem-efficient pads the LSE to kAlignLSE=32
            lse = q.new_empty((b, h, lse_len), dtype=torch.float32)
        if not _is_fake(q):
            with _hidden(), torch.no_grad():
                out.copy_(_reference_attention(q, k, v, bias, is_causal, scale, gqa))
        ctx.save_for_backward(q, k, v, out, lse, bias)
        ctx.is_causal, ctx.scale, ctx.backend, ctx.gqa = is_causal, scale, backend, gqa
        ctx.mark_non_differentiable(lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, bias = ctx.saved_tensors
        b, h, t, d = q.shape
        tk, hk = k.shape[-2], k.shape[-3]
        if dout.stride(-1) != 1:  # the kernels need a unit last stride (check in mha_bwd / efficient backward)
            dout = dout.contiguous()
        work = []
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if ctx.backend == "flash":
            # flash_api.cpp mha_bwd: softmax_d, fp32 dq accumulator, expanded dk/dv for GQA
            work.append(q.new_empty((b, h, _round(t, 128)), dtype=torch.float32))
            work.append(q.new_empty((b, _round(t, 128), h, _round(d, 32 if d <= 128 else 64)), dtype=torch.float32))
            if hk != h:
                work += [q.new_empty((b, tk, h, d)), q.new_empty((b, tk, h, v.shape[-1]))]
        elif ctx.backend == "efficient":
            # attention_backward.cu _efficient_attention_backward: delta + fp32 grad-Q accumulation workspace
            work.append(q.new_empty((b, h, t), dtype=torch.float32))
            work.append(q.new_empty((b, h, _round(t, 64), _round(d, 64)), dtype=torch.float32))
        if not _is_fake(q):
            with _hidden(), torch.enable_grad():
                qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
                ref = _reference_attention(qq, kk, vv, bias, ctx.is_causal, ctx.scale, ctx.gqa)
                gq, gk, gv = torch.autograd.grad(ref, (qq, kk, vv), dout)
                dq.copy_(gq), dk.copy_(gk), dv.copy_(gv)
        del work
        return dq, dk, dv, None, None, None, None, None


def _autocast_inputs(*ts):
    if not torch.is_autocast_enabled("cpu"):
        return ts
    dtype = torch.get_autocast_dtype("cpu")
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point()
                 and t.dtype not in (dtype, torch.float64) else t for t in ts)


def _preprocess_mask_efficient(bias, q, k):
    """attention.cpp preprocess_mask: pad the last dim to a multiple of 8 if unaligned, expand to B,H,Tq,Tk."""
    aligned = all(s % 8 == 0 for s in bias.stride()[:-1]) and bias.stride(-1) == 1
    if not aligned:
        tk = bias.shape[-1]
        bias = F.pad(bias, (0, 8 - tk % 8))[..., :tk]
    return bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def cuda_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """`F.scaled_dot_product_attention` as a CUDA device would run it (see module docstring)."""
    state = _STATE
    if state is None:
        return _ORIG_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                          scale=scale, enable_gqa=enable_gqa)
    query, key, value, attn_mask = _autocast_inputs(query, key, value, attn_mask)
    backend = sdpa_backend(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, state.target)
    state.kernels[f"sdpa:{backend}"] += 1
    if backend == "math":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.MATH]):
            return _ORIG_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                              scale=scale, enable_gqa=enable_gqa)
    bias = attn_mask
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        fill = -65504.0 if backend == "cudnn" else float("-inf")  # convert_boolean_attn_mask(_cudnn)
        bias = torch.where(attn_mask.logical_not(), fill, torch.zeros((), dtype=query.dtype))
    if bias is not None and backend == "efficient":
        bias = _preprocess_mask_efficient(bias, query, key)
    return _FusedSDPA.apply(query, key, value, bias, is_causal and bias is None, scale, backend, enable_gqa)


# ---------------------------------------------------------------------------------------------- flash_attention_2
class _FlashAttn2(torch.autograd.Function):
    """flash_attn.flash_attn_interface FlashAttnFunc / FlashAttnVarlenFunc on (B,T,H,D) or (total,H,D) inputs."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))  # maybe_contiguous
        d = q.shape[-1]
        if d % 8:
            q, k, v = (F.pad(x, [0, 8 - d % 8]) for x in (q, k, v))
        out = torch.empty_like(q)
        heads = q.shape[-2]
        if q.dim() == 4:
            lse = q.new_empty((q.shape[0], heads, q.shape[1]), dtype=torch.float32)
        else:
            lse = q.new_empty((heads, q.shape[0]), dtype=torch.float32)
        rng_state = q.new_empty((2,), dtype=torch.int64)
        if not _is_fake(q):
            with _hidden(), torch.no_grad():
                out.copy_(_flash_reference(q, k, v, causal, scale))
        ctx.save_for_backward(q, k, v, out, lse, rng_state)
        ctx.causal, ctx.scale, ctx.d = causal, scale, d
        return out[..., :d]

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, rng_state = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dout = dout if dout.stride(-1) == 1 else dout.contiguous()
        if dout.shape[-1] != q.shape[-1]:
            dout = F.pad(dout, [0, q.shape[-1] - dout.shape[-1]])
        heads, d = q.shape[-2], q.shape[-1]
        d_round = _round(d, 32 if d <= 128 else 64)
        if q.dim() == 4:
            b, t = q.shape[0], q.shape[1]
            work = [q.new_empty((b, heads, _round(t, 128)), dtype=torch.float32),
                    q.new_empty((b, _round(t, 128), heads, d_round), dtype=torch.float32)]
            expanded: tuple[int, ...] = (b, k.shape[1], heads, d)
        else:  # varlen: (total + 128 * batch) rows; one sequence stands for the batch here
            total = q.shape[0]
            work = [q.new_empty((heads, total + 128), dtype=torch.float32),
                    q.new_empty((total + 128, heads, d_round), dtype=torch.float32)]
            expanded = (k.shape[0], heads, d)
        if k.shape[-2] != heads:
            work += [q.new_empty(expanded), q.new_empty(expanded)]
        if not _is_fake(q):
            with _hidden(), torch.enable_grad():
                qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
                ref = _flash_reference(qq, kk, vv, ctx.causal, ctx.scale)
                for g, dst in zip(torch.autograd.grad(ref, (qq, kk, vv), dout), (dq, dk, dv)):
                    dst.copy_(g)
        del work
        return dq[..., :ctx.d], dk[..., :ctx.d], dv[..., :ctx.d], None, None


def _flash_reference(q, k, v, causal, scale):
    squeeze = q.dim() == 3
    if squeeze:
        q, k, v = (x.unsqueeze(0) for x in (q, k, v))
    o = _ORIG_SDPA(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=scale,
                   enable_gqa=q.shape[2] != k.shape[2]).transpose(1, 2)
    return o.squeeze(0) if squeeze else o


def flash_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                            sliding_window=None, softcap=None, is_causal=None, **kwargs):
    """transformers integrations/flash_attention.py `flash_attention_forward` + `_flash_attention_forward`,
    with flash_attn's kernels replaced by `_FlashAttn2`. The padding of the batch comes from the tracer
    (`_State.unpad_tokens`), because reading the mask would be data-dependent on fake tensors."""
    from transformers.integrations.flash_attention import get_target_dtype
    from transformers.modeling_flash_attention_utils import _index_first_axis, _pad_input, fa_peft_integration_check

    batch, seq_len = query.shape[0], query.shape[2]
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    q, k, v = fa_peft_integration_check(q, k, v, get_target_dtype(q, module))
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    state = _STATE
    if state is not None and state.unpad_tokens is not None and state.unpad_tokens < batch * seq_len:
        # _get_unpad_data: torch.nonzero makes a fresh int64 index tensor in every layer
        indices = torch.empty((state.unpad_tokens,), dtype=torch.int64, device=q.device)
        seqlens = torch.empty((batch,), dtype=torch.int32, device=q.device)
        cu_seqlens = torch.empty((batch + 1,), dtype=torch.int32, device=q.device)
        if not _is_fake(q):
            if state.batch_indices is None:
                raise MemfitError("a real padded flash-attention run needs the batch's token indices "
                                  "(emulate_cuda(..., unpad_tokens=..., batch_indices=...))")
            indices.copy_(state.batch_indices)
        q, k, v = (_index_first_axis(x, indices) for x in (q, k, v))
        state.kernels["flash_attention_2:varlen"] += 1
        out = _FlashAttn2.apply(q, k, v, causal, scaling)
        del seqlens, cu_seqlens
        return _pad_input(out, indices, batch, seq_len), None
    if state is not None:
        state.kernels["flash_attention_2"] += 1
    return _FlashAttn2.apply(q, k, v, causal, scaling), None


def register_flash() -> str:
    """Register the FlashAttention-2 stand-in with transformers; returns its attn_implementation name."""
    from transformers import AttentionInterface

    AttentionInterface.register(FLASH_NAME, flash_attention_forward)
    return FLASH_NAME


# ---------------------------------------------------------------------------------------------- the context
def _cuda_dropout(input, p=0.5, training=True, inplace=False):
    """aten dropout on a CUDA tensor: the fused `native_dropout` kernel whenever 0 < p < 1."""
    if training and 0.0 < p < 1.0 and input.numel() > 0 and not inplace:
        return torch.native_dropout(input, p, True)[0]
    return _ORIG_DROPOUT(input, p, training, inplace)


def _is_autocast_enabled(device_type=None):
    if device_type in (None, "cuda"):
        return _ORIG_IS_AUTOCAST("cpu")
    return _ORIG_IS_AUTOCAST(device_type)


@contextmanager
def emulate_cuda(target: CudaTarget, accountant=None, unpad_tokens: int | None = None,
                 batch_indices: torch.Tensor | None = None):
    """Inside: SDPA picks CUDA kernels, the flash stand-in knows the batch's padding, an autocast region follows
    CUDA's op lists, and `torch.is_autocast_enabled()` (meaning CUDA) reports the CPU autocast region."""
    global _STATE
    previous = _STATE
    _STATE = _State(target, accountant, unpad_tokens, batch_indices)
    F.scaled_dot_product_attention = cuda_sdpa
    F.dropout = _cuda_dropout
    torch.is_autocast_enabled = _is_autocast_enabled
    try:
        with CudaAutocastPolicy():  # forward and backward: checkpointing recomputes under autocast in backward
            yield _STATE
    finally:
        _STATE = previous
        if previous is None:
            F.scaled_dot_product_attention = _ORIG_SDPA
            F.dropout = _ORIG_DROPOUT
            torch.is_autocast_enabled = _ORIG_IS_AUTOCAST
