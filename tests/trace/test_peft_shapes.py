"""memfit's rules for the factor sizes of LoKr, OFT and BOFT (facts/peft_shapes.py) choose what PEFT itself chooses:
the layers PEFT builds for real widths (on the meta device) have the shapes the rules give."""
import warnings

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from memfit.facts.adapters import elements_of, facts_for  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402
from memfit.facts.peft_shapes import fact_key, kron_factors, layer_sizes, oft_block  # noqa: E402
from memfit.trace.peft import _shaped_permutations  # noqa: E402

# (in, out): Llama / Mistral attention and MLP, Qwen2-7B's MLP, TinyLlama's MLP, Qwen2.5-0.5B's k/v, and widths
# no block of 32 divides (3000, 1000) or that are prime (127: one Kronecker factor is 1)
WIDTHS = [(4096, 4096), (4096, 14336), (14336, 4096), (3584, 18944), (2048, 5632), (896, 128), (4864, 896),
          (3000, 1000), (127, 96), (20, 36)]
RANKS = (1, 8, 16, 64)


class _One(torch.nn.Module):
    def __init__(self, fan_in: int, fan_out: int):
        super().__init__()
        self.proj = torch.nn.Linear(fan_in, fan_out, bias=False)


def _built(config, fan_in: int, fan_out: int):
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # OFT warns when it adjusts the block size
        return peft.get_peft_model(_One(fan_in, fan_out), config).base_model.model.proj


@pytest.mark.parametrize("fan_in, fan_out", WIDTHS)
@pytest.mark.parametrize("rank", RANKS)
def test_lokr_factors_and_branch_are_peft_s(fan_in, fan_out, rank):
    layer = _built(peft.LoKrConfig(r=rank, target_modules=["proj"]), fan_in, fan_out)
    sizes = layer_sizes("lokr", fan_in, fan_out, rank)
    assert tuple(layer.lokr_w1["default"].shape) == (sizes["O1"], sizes["I1"])
    full = "default" in layer.lokr_w2
    assert (fact_key("lokr", sizes) == "lokr_full") == full
    w2 = layer.lokr_w2["default"].shape if full else (layer.lokr_w2_a["default"].shape[0],
                                                       layer.lokr_w2_b["default"].shape[1])
    assert tuple(w2) == (sizes["O2"], sizes["I2"])
    trainable = sum(p.numel() for p in layer.parameters() if p.requires_grad)
    assert elements_of(facts_for("lokr", "fp32", sizes=sizes)["trainable"], sizes) == trainable


@pytest.mark.parametrize("fan_in, fan_out", WIDTHS)
def test_oft_block_size_is_peft_s(fan_in, fan_out):
    layer = _built(peft.OFTConfig(target_modules=["proj"]), fan_in, fan_out)
    sizes = layer_sizes("oft", fan_in, fan_out, 8)
    assert layer.oft_block_size["default"] == sizes["B"]
    assert layer.r["default"] == sizes["K"]
    trainable = sum(p.numel() for p in layer.parameters() if p.requires_grad)
    assert elements_of(facts_for("oft", "fp32", sizes=sizes)["trainable"], sizes) == trainable


@pytest.mark.parametrize("fan_in, fan_out", WIDTHS)
def test_boft_blocks_and_buffer_are_peft_s(fan_in, fan_out):
    """BOFT's blocks of 4 (a width they do not divide: PEFT and memfit both refuse it), its trainable tensors and
    its per-Linear permutation buffer, against the layer PEFT builds (on meta; the buffer's entries unfilled)."""
    if fan_in % 4:
        with pytest.raises(ValueError, match="divisible by boft_block_size"), _shaped_permutations(True):
            _built(peft.BOFTConfig(target_modules=["proj"]), fan_in, fan_out)
        with pytest.raises(MemfitError, match="blocks of 4"):
            layer_sizes("boft", fan_in, fan_out, 8)
        return
    with _shaped_permutations(True):
        layer = _built(peft.BOFTConfig(target_modules=["proj"]), fan_in, fan_out)
    sizes = layer_sizes("boft", fan_in, fan_out, 8)
    assert tuple(layer.boft_R["default"].shape) == (1, sizes["K"], sizes["B"], sizes["B"])
    facts = facts_for("boft", "fp32", sizes=sizes)
    trainable = sum(p.numel() for p in layer.parameters() if p.requires_grad)
    assert elements_of(facts["trainable"], sizes) == trainable
    assert elements_of(facts["frozen"], sizes) == layer.boft_P.numel()
    assert facts["frozen"][0][1] == layer.boft_P.element_size()


def test_the_rules_on_numbers_whose_answer_is_known():
    assert kron_factors(4096) == (64, 64)
    assert kron_factors(14336) == (112, 128)
    assert kron_factors(127) == (1, 127)
    assert oft_block(4096) == 32
    assert oft_block(3000) == 30  # 30 and 40 divide 3000; 30 is nearer 32
    assert oft_block(20) == 20  # a block as wide as the input
