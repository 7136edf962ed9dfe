"""CUDA's autocast policy on a CPU trace.

A CPU trace runs under CPU autocast, whose op lists are not CUDA's: on a 16-bit input CPU autocast leaves
layer_norm, rms_norm, softmax without dtype=, pow, exp, rsqrt, logsumexp and sum in 16 bit, where CUDA autocast
runs them in fp32 - a fp32 copy of the input that the op may save for backward, and a fp32 output that the next
elementwise op promotes. CUDA's lists are the macros of ATen/autocast_mode.h, which the CPU wheel ships too:
`python -m memfit.trace.autocast` writes them to data/cuda_autocast.toml with torch's version, `--check` compares.

Inside a CPU autocast region (which already casts linear/matmul/bmm inputs to 16 bit as CUDA does, with the same
weight-cast cache) `CudaAutocastPolicy` applies the rest of CUDA's policy at the Python API, above autograd, so the
cast copies are what backward saves, as on the GPU. Outside a region it does nothing, so it stays on through
backward, where checkpointing recomputes forward under the autocast state it saved:
  fp32           cast every 16-bit floating tensor argument to fp32
  fp32_opt_dtype no dtype= given and a floating first argument: run with dtype=torch.float32
  promote        cast floating tensor arguments to the widest floating dtype among them
  lower          the lower-precision ops CPU autocast does not cast (mv, addmv, addr, ...): cast to the region's dtype
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from memfit.facts.data_table import data_table

TABLE = Path(__file__).resolve().parent.parent / "facts" / "data" / "cuda_autocast.toml"
MACROS = {"lower": "AT_FORALL_LOWER_PRECISION_FP", "fp32": "AT_FORALL_FP32",
          "fp32_opt_dtype": "AT_FORALL_FP32_SET_OPT_DTYPE", "promote": "AT_FORALL_PROMOTE"}
# norm.Scalar / norm.ScalarOpt_dim: CUDA appends dtype=fp32 (AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE)
APPEND_DTYPE = ("norm",)
# CUDA's lower-precision ops that CPU autocast casts itself (checked by tests/trace/test_autocast.py); casting them
# again here would bypass its weight-cast cache
CPU_LOWERS = frozenset({"linear", "matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "einsum", "conv1d", "conv2d",
                        "conv3d", "_convolution", "convolution", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
                        "conv_transpose3d", "prelu", "scaled_dot_product_attention", "linalg_vecdot"})


def header_path() -> Path:
    return Path(torch.__file__).resolve().parent / "include" / "ATen" / "autocast_mode.h"


def header_lists(text: str) -> dict[str, list[str]]:
    """Each policy's op names (overloads folded) from the header's `#define AT_FORALL_...(_)` bodies."""
    out = {}
    for policy, macro in MACROS.items():
        body = re.search(rf"#define {macro}\(_\)((?:.*\\\n)*.*)", text)
        if body is None:
            raise ValueError(f"{macro} not found in autocast_mode.h")
        names = re.findall(r"_\((\w+)", body.group(1))
        out[policy] = sorted(dict.fromkeys(names))
    return out


def render() -> str:
    lists = header_lists(header_path().read_text())
    lines = ["# CUDA autocast's op lists (ATen/autocast_mode.h of the torch below; written by",
             "# `python -m memfit.trace.autocast`, read by memfit/trace/autocast.py). Overloads are folded into one name.",
             f'torch = "{torch.__version__.split("+")[0]}"', ""]
    for policy, names in lists.items():
        lines.append(f"{policy} = [" + ", ".join(f'"{n}"' for n in names) + "]")
    return "\n".join(lines) + "\n"


def _policies() -> dict[str, str]:
    table = data_table(TABLE.name)
    by_name = {n: p for p in ("lower", "fp32", "fp32_opt_dtype", "promote") for n in table[p]}
    by_name.update({n: "fp32_opt_dtype" for n in APPEND_DTYPE})
    return {n: p for n, p in by_name.items() if not (p == "lower" and n in CPU_LOWERS)}


def _python_name(func) -> str:
    """`Tensor.__pow__` / `__rpow__` / `torch.pow` / `F.layer_norm` -> the ATen name the lists use."""
    name = getattr(func, "__name__", "")
    if name.startswith("__r") and name.endswith("__"):
        return name[3:-2]
    return name.strip("_") if name.startswith("__") else name


def _eligible(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _cast(value, dtype):
    if _eligible(value) and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (list, tuple)) and any(_eligible(v) for v in value):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _tensors(args, kwargs):
    for v in (*args, *kwargs.values()):
        yield from (v if isinstance(v, (list, tuple)) else (v,))


class CudaAutocastPolicy(TorchFunctionMode):
    """The part of CUDA autocast's policy that CPU autocast does not apply (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self.policy = _policies()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in BACKWARDS:  # a handler runs with its mode off; the recomputation inside backward needs it on
            with self:
                return _backward(*_backward_call(func, args, kwargs))
        policy = self.policy.get(_python_name(func))
        if policy is None or not torch.is_autocast_enabled("cpu"):
            return func(*args, **kwargs)
        if policy == "fp32_opt_dtype":
            return func(*args, **_with_fp32_dtype(args, kwargs))
        dtype = {"fp32": torch.float32, "lower": torch.get_autocast_dtype("cpu")}.get(policy) or _widest(args, kwargs)
        if dtype is None:
            return func(*args, **kwargs)
        return func(*(_cast(a, dtype) for a in args), **{k: _cast(v, dtype) for k, v in kwargs.items()})


BACKWARDS = {torch.Tensor.backward: ("gradient", "retain_graph", "create_graph", "inputs"),
             torch.autograd.backward: ("grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs")}


def _backward_call(func, args, kwargs) -> tuple:
    """(tensors, their gradients, retain_graph, create_graph, inputs) of either backward's call."""
    first, *rest = args
    given = dict(zip(BACKWARDS[func], rest)) | kwargs
    tensors = (first,) if isinstance(first, torch.Tensor) else tuple(first)
    grads = given.get("gradient", given.get("grad_tensors"))
    grads = (grads,) * len(tensors) if grads is None or isinstance(grads, torch.Tensor) else tuple(grads)
    inputs = given.get("inputs")
    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs or ())
    return tensors, grads, given.get("retain_graph"), given.get("create_graph", False), inputs


def _backward(tensors, grads, retain_graph, create_graph, inputs) -> None:
    """What torch.autograd.backward runs, called below its torch-function check so that the mode stays on."""
    from torch.autograd.graph import _engine_run_backward

    grads = tuple(torch.ones_like(t, memory_format=torch.preserve_format) if g is None else g
                  for t, g in zip(tensors, grads))
    _engine_run_backward(tensors, grads, create_graph if retain_graph is None else retain_graph, create_graph,
                         inputs, allow_unreachable=True, accumulate_grad=True)


def _with_fp32_dtype(args, kwargs) -> dict:
    """dtype=fp32 unless the call names a dtype or its first argument is not an eligible tensor."""
    if not args or not _eligible(args[0]) or kwargs.get("dtype") is not None:
        return kwargs
    if any(isinstance(a, torch.dtype) for a in args[1:]):
        return kwargs
    return {**kwargs, "dtype": torch.float32}


def _widest(args, kwargs):
    floats = [t.dtype for t in _tensors(args, kwargs) if _eligible(t)]
    if len(set(floats)) < 2:
        return None
    return max(floats, key=lambda d: torch.finfo(d).bits)


def derived_text() -> str:
    return render()


if __name__ == "__main__":
    from memfit.trace.fact_file import write_or_check

    sys.exit(write_or_check("CUDA autocast's op lists from the installed torch's autocast_mode.h", TABLE, render,
                            f"torch {torch.__version__}"))
