"""The trace's autocast follows CUDA's op lists (memfit/trace/autocast.py), read from torch's own header."""
from contextlib import contextmanager

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from memfit.trace import autocast  # noqa: E402
from memfit.trace.autocast import CudaAutocastPolicy  # noqa: E402

BF16 = torch.bfloat16


@contextmanager
def _cuda_autocast():
    with torch.autocast("cpu", dtype=BF16), CudaAutocastPolicy():
        yield


def test_the_shipped_lists_are_the_installed_torch_header():
    assert autocast.TABLE.read_text() == autocast.render(), "re-derive: python -m memfit.trace.autocast"


def test_the_header_parser_reads_each_policy_and_folds_overloads():
    lists = autocast.header_lists(autocast.header_path().read_text())
    assert {"layer_norm", "pow", "rsqrt", "rms_norm"} <= set(lists["fp32"])
    assert lists["fp32"].count("pow") == 1  # pow.Tensor_Scalar / Tensor_Tensor / Scalar
    assert {"softmax", "log_softmax", "sum"} <= set(lists["fp32_opt_dtype"])
    assert {"linear", "matmul", "bmm", "baddbmm"} <= set(lists["lower"])
    with pytest.raises(ValueError, match="AT_FORALL_FP32"):
        autocast.header_lists("#define AT_FORALL_LOWER_PRECISION_FP(_) _(mm)\n")


def test_cpu_autocast_casts_the_ops_left_to_it_and_not_the_others():
    """CPU_LOWERS is what CPU autocast itself casts to bf16; CUDA's other lower-precision ops are cast here."""
    a, v = torch.randn(4, 8), torch.randn(8)
    with torch.autocast("cpu", dtype=BF16):
        assert F.linear(a, a).dtype == torch.matmul(a, a.T).dtype == torch.einsum("ij,kj->ik", a, a).dtype == BF16
        assert torch.bmm(a[None], a.T[None]).dtype == torch.baddbmm(a[None, :, :4], a[None], a.T[None, :, :4]).dtype == BF16
        assert torch.mv(a, v).dtype == torch.float32  # CUDA casts it; CPU does not
    with _cuda_autocast():
        assert torch.mv(a, v).dtype == torch.addmv(v[:4], a, v).dtype == BF16


def test_fp32_ops_upcast_16_bit_inputs_and_save_the_fp32_copy():
    x = torch.randn(2, 8, dtype=BF16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t), _cuda_autocast():
        y = F.layer_norm(x * 1, (8,))
    assert y.dtype == torch.float32
    assert any(t.dtype == torch.float32 and t.shape == x.shape for t in saved)  # its input, as fp32
    with _cuda_autocast():
        assert (x.pow(2).dtype, (x ** 3).dtype, torch.rsqrt(x.abs() + 1).dtype) == (torch.float32,) * 3
        assert torch.logsumexp(x, -1).dtype == torch.float32


def test_ops_with_an_optional_dtype_run_in_fp32_unless_the_call_names_one():
    x = torch.randn(2, 8, dtype=BF16)
    with _cuda_autocast():
        assert F.softmax(x, -1).dtype == x.softmax(-1).dtype == x.sum().dtype == torch.float32
        assert F.softmax(x, -1, dtype=BF16).dtype == BF16
        assert torch.softmax(x, -1, BF16).dtype == BF16  # a positional dtype counts as named
        assert torch.ones(3, dtype=torch.long).sum().dtype == torch.long  # not a floating input


def test_promote_ops_take_the_widest_input_and_nothing_changes_outside_a_region():
    b, f = torch.randn(4, dtype=BF16), torch.randn(4)
    with _cuda_autocast():
        assert torch.addcmul(b, b, f).dtype == torch.float32
    with CudaAutocastPolicy():  # no autocast region: CUDA autocast would not act either
        assert F.layer_norm(b, (4,)).dtype == F.softmax(b, -1).dtype == BF16


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing_recomputes_under_the_same_lists(reentrant):
    """Backward recomputes a checkpointed forward; it must see the lists too (else torch's metadata check fails)."""
    norm = torch.nn.LayerNorm(8).to(BF16)
    x = torch.randn(2, 8, dtype=BF16, requires_grad=True)
    with CudaAutocastPolicy():
        with torch.autocast("cpu", dtype=BF16):
            y = checkpoint(norm, x * 1, use_reentrant=reentrant)
        assert y.dtype == torch.float32
        y.sum().backward()
    assert x.grad.dtype == BF16 and x.grad.shape == x.shape
