"""LoRA over a bitsandbytes LLM.int8 base (`--tuning qlora --quant-bits 8`; transformers load_in_8bit), as
bitsandbytes 0.49's `MatMul8bitLt` (autograd/_functions.py) holds it during training:
  - each frozen int8 Linear keeps its input A on ctx whenever the input needs a gradient (activations.py counts it
    with the Linear inputs, as the 4-bit path of old bitsandbytes);
  - with llm_int8_threshold > 0 (transformers' default 6.0) it also keeps `subA`, the input's outlier columns in fp16:
    data-dependent, so assumed (dtypes.INT8_OUTLIER_SHARE of every Linear's input columns) and said under "assumed";
  - backward dequantizes the int8 weight to the input dtype for the input's gradient, one Linear at a time.
The weights: 1 byte each and an fp32 scale per output row (dtypes.int8_bytes)."""
from __future__ import annotations

from memfit.dtypes import INT8_OUTLIER_SHARE
from memfit.facts.scenario import Scenario


def outlier_bytes(s: Scenario) -> int:
    """fp16 bytes per token one layer's int8 Linears keep of their inputs' outlier columns (0 on another base)."""
    if s.tuning != "qlora" or s.quant_bits != 8:
        return 0
    m = s.model
    inputs = 2 * m.hidden_size if m.mlp == "gated" else m.hidden_size  # gate + up / fc read the normed input
    widths = 3 * m.hidden_size + m.num_heads * m.head_dim + inputs + m.intermediate_size  # q k v, o, MLP in, down
    return int(2 * INT8_OUTLIER_SHARE * widths)
