"""QLoRA without bitsandbytes: 4-bit (and LLM.int8) Linear stand-ins with bitsandbytes' storage and transients.

bitsandbytes kernels do not run on fake CPU tensors, so each base Linear (all but the output
embedding, like transformers' `get_keys_to_not_convert`) becomes a module holding what
`bnb.nn.Linear4bit` holds on the GPU for NF4 with double quantization (LLaMA-Factory / OpenRLHF
default; docs/knobs.md D): the packed weight (uint8, 2 values per byte, `Params4bit` shape (n/2, 1)),
uint8 absmax per 64-value block, fp32 absmax-of-absmax per 256 blocks and an fp32 offset. Its
forward is bitsandbytes' `MatMul4Bit` as memory sees it: dequantize the whole weight to the compute
dtype (a per-layer transient, plus the fp32 absmax it dequantizes first), matmul, save nothing but
the packed weight for backward, dequantize again in backward. LoRA layers on top get PEFT's
`lora.bnb.Linear4bit.forward` (the defensive `result.clone()` and the dtype conversions).
"""
from __future__ import annotations

import types
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

BLOCKSIZE = 64  # bitsandbytes quantize_4bit default
DQ_BLOCKSIZE = 256  # double quantization of absmax (compress_statistics)


class _MatMul4Bit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, packed, absmax, absmax2, offset, bias, shape):
        weight = _dequantize(packed, absmax, absmax2, offset, shape, x.dtype)
        out = torch.nn.functional.linear(x, weight, bias)
        del weight
        ctx.save_for_backward(packed, absmax, absmax2, offset)
        ctx.shape, ctx.has_bias, ctx.bias_dtype = shape, bias is not None, None if bias is None else bias.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        packed, absmax, absmax2, offset = ctx.saved_tensors
        grad_x = grad_bias = None
        if ctx.needs_input_grad[0]:
            weight = _dequantize(packed, absmax, absmax2, offset, ctx.shape, grad_out.dtype)
            grad_x = torch.matmul(grad_out, weight)
            del weight
        if ctx.has_bias and ctx.needs_input_grad[5]:
            grad_bias = grad_out.sum(0, dtype=ctx.bias_dtype)
        return grad_x, None, None, None, None, grad_bias, None


def _dequantize(packed, absmax, absmax2, offset, shape, dtype):
    """bitsandbytes functional.dequantize_4bit: fp32 absmax from the double-quantized one, then the weight."""
    scales = torch.empty(absmax.shape, dtype=torch.float32, device=absmax.device)  # dequantize_blockwise(absmax)
    scales += offset
    weight = torch.empty(shape, dtype=dtype, device=packed.device)
    weight.zero_()  # values do not matter for memory; zeros keep real runs finite
    del scales
    return weight


class Linear4bit(nn.Module):
    """Memory stand-in for `bnb.nn.Linear4bit` (NF4, double quantization, uint8 storage)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        out_features, in_features = linear.weight.shape
        n = out_features * in_features
        device = linear.weight.device
        blocks = -(-n // BLOCKSIZE)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(((n + 1) // 2, 1), dtype=torch.uint8, device=device),
                                   requires_grad=False)
        self.register_buffer("absmax", torch.empty((blocks,), dtype=torch.uint8, device=device))
        self.register_buffer("absmax2", torch.empty((-(-blocks // DQ_BLOCKSIZE),), dtype=torch.float32, device=device))
        self.register_buffer("offset", torch.empty((), dtype=torch.float32, device=device))
        self.bias = linear.bias
        if self.bias is not None:
            self.bias.requires_grad_(False)

    def forward(self, x):
        return _MatMul4Bit.apply(x, self.weight, self.absmax, self.absmax2, self.offset, self.bias,
                                 (self.out_features, self.in_features))


class _MatMul8bitLt(torch.autograd.Function):
    """bitsandbytes 0.49 `MatMul8bitLt` with a frozen int8 weight, as memory sees it: the fp16 copy of the input
    it quantizes (int8 rows, an fp32 scale per row) is a forward transient; with a threshold it keeps the outlier
    columns (fp16, `subA`) and the input A itself on ctx; backward dequantizes the weight to A's dtype."""

    @staticmethod
    def forward(ctx, x, weight, scb, bias, outliers):
        a = x.reshape(-1, x.shape[-1])
        half = a.to(torch.float16)  # A.to(torch.float16) for int8_vectorwise_quant
        quantized = torch.empty(half.shape, dtype=torch.int8, device=x.device)
        row_scale = torch.empty(half.shape[0], dtype=torch.float32, device=x.device)
        sub = half[:, :outliers].clone()  # int8_mixed_scaled_mm: the outlier columns (assumed count)
        del half, quantized, row_scale
        weight_16 = weight.to(x.dtype)  # the mixed matmul's dequantized weight (transient)
        out = torch.nn.functional.linear(a, weight_16, bias).reshape(*x.shape[:-1], weight.shape[0])
        del weight_16
        ctx.save_for_backward(a, sub, weight, scb)  # ctx.tensors = (CAt=None, subA, A); state.CB, SCB
        ctx.x_shape, ctx.has_bias = x.shape, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        a, sub, weight, scb = ctx.saved_tensors
        grad_x = grad_bias = None
        if ctx.needs_input_grad[0]:
            cb = weight.to(a.dtype)  # CB.to(dtype_A, copy=True).mul_(SCB / 127)
            scale = scb.unsqueeze(1).mul(1.0 / 127.0)
            cb.mul_(scale)
            grad_x = torch.matmul(grad_out.reshape(-1, grad_out.shape[-1]).to(a.dtype), cb).view(ctx.x_shape)
            del cb, scale
        if ctx.has_bias and ctx.needs_input_grad[3]:
            grad_bias = grad_out.reshape(-1, grad_out.shape[-1]).sum(0)
        return grad_x, None, None, grad_bias, None


class Linear8bitLt(nn.Module):
    """Memory stand-in for `bnb.nn.Linear8bitLt` (Int8Params: int8 weight, fp32 SCB per output row)."""

    def __init__(self, linear: nn.Linear, outlier_share: float):
        super().__init__()
        out_features, in_features = linear.weight.shape
        device = linear.weight.device
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty((out_features, in_features), dtype=torch.int8, device=device),
                                   requires_grad=False)
        self.register_buffer("SCB", torch.empty((out_features,), dtype=torch.float32, device=device))
        self.bias = linear.bias
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.outliers = max(1, round(outlier_share * in_features))

    def forward(self, x):
        return _MatMul8bitLt.apply(x, self.weight, self.SCB, self.bias, self.outliers)


def _lora_bnb_forward(self, x, *args, **kwargs):
    """peft/tuners/lora/bnb.py `Linear4bit.forward` / `Linear8bitLt.forward` (peft 0.21), vanilla LoRA / DoRA
    variants: the same but for the 4-bit one's defensive clone of the base output."""
    result = self.base_layer(x, *args, **kwargs)
    if isinstance(self.base_layer, Linear4bit):
        result = result.clone()  # "As per Tim Dettmers, for 4bit, we need to defensively clone here."
    for active_adapter in self.active_adapters:
        if active_adapter not in self.lora_A.keys():
            continue
        lora_A, lora_B = self.lora_A[active_adapter], self.lora_B[active_adapter]
        dropout, scaling = self.lora_dropout[active_adapter], self.scaling[active_adapter]
        requires_conversion = not torch.is_autocast_enabled()
        if requires_conversion:
            expected_dtype = result.dtype
            x = self._cast_input_dtype(x, lora_A.weight.dtype)
        output = lora_B(lora_A(dropout(x))) * scaling
        if requires_conversion:
            output = output.to(expected_dtype)
        result = result + output
    return result


def _adapts_quantized(module: nn.Module) -> bool:
    """A PEFT LoRA layer over a quantized Linear: only those take the bitsandbytes forward. bitsandbytes leaves
    stacked expert parameters unquantized, and PEFT's own wrapper of them (its forward returns the experts' tuple)
    keeps its forward."""
    from peft.tuners.lora import LoraLayer

    return isinstance(module, LoraLayer) and isinstance(getattr(module, "base_layer", None), (Linear4bit, Linear8bitLt))


def quantize_linears(model: nn.Module, hf_model: PreTrainedModel, compute_dtype: torch.dtype, bits: int = 4) -> str:
    """Replace every base Linear except the output embedding by a 4-bit (or 8-bit) stand-in; returns a note."""
    from memfit.dtypes import INT8_OUTLIER_SHARE as OUTLIER_SHARE

    from peft.tuners.lora import LoraLayer

    head = hf_model.get_output_embeddings()
    head = getattr(head, "base_layer", head)
    if any(getattr(layer, "use_dora", {}).get(name) for layer in model.modules() if isinstance(layer, LoraLayer)
           for name in layer.active_adapters):
        from memfit.errors import MemfitError

        raise MemfitError("trace does not model QLoRA + DoRA (PEFT dequantizes the 4-bit weight for the norm)")
    if any(p.dim() == 3 for p in hf_model.parameters()):  # transformers 5's stacked experts
        from memfit.errors import MemfitError

        raise MemfitError("trace does not model QLoRA over stacked MoE experts (bitsandbytes leaves them unquantized "
                          "and the k-bit upcast makes them fp32, which the grouped expert matmul refuses)")
    count = 0
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear) or child is head or "lora_" in f"{parent_name}.{child_name}":
                continue
            setattr(parent, child_name, Linear4bit(child) if bits == 4 else Linear8bitLt(child, OUTLIER_SHARE))
            count += 1
        if _adapts_quantized(parent):
            parent.forward = types.MethodType(_lora_bnb_forward, parent)
    if bits == 8:
        return (f"8-bit LoRA: {count} Linear layers as LLM.int8 stand-ins (int8 weight, fp32 row scales; each keeps "
                f"its input and {OUTLIER_SHARE:.0%} outlier columns)")
    return (f"QLoRA: {count} Linear layers as NF4 + double-quant stand-ins (bitsandbytes storage sizes, "
            f"per-layer dequantized {str(compute_dtype).removeprefix('torch.')} transient)")
