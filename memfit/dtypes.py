"""Bytes per element of each storage format memfit reasons about."""

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}

# bitsandbytes 4-bit (docs/knobs.md D): 0.5 B packed + fp32 absmax per 64-element block;
# double quantization stores absmax as uint8 with an fp32 scale per 256 blocks.
NF4_BYTES = 0.5 + 4 / 64
NF4_DQ_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
# bitsandbytes LLM.int8 (Int8Params): 1 B per weight + an fp32 scale (SCB) per output row, i.e. per `in` weights
def int8_bytes(in_features: int) -> float:
    return 1 + 4 / in_features


# LLM.int8's outlier columns (|x| > llm_int8_threshold, 6.0) that MatMul8bitLt keeps in fp16: data-dependent; a few
# hidden dims hold them (Dettmers et al. 2022), so 1% of each Linear's input columns errs high (an assumption)
INT8_OUTLIER_SHARE = 0.01


# GPTQ int4 (auto-gptq): packed int32 qweight (0.5 B) + fp16 scale and 4-bit zero per group of 128 inputs.
GPTQ_BYTES_PER_GROUP_OF_128 = 0.5 + (2 + 0.5) / 128
# FP8 checkpoints (DeepSeek-V3 style, transformers FP8 quantizer): 1 byte per weight + an fp32 scale per 128x128 block.
FP8_BLOCK_BYTES = 1 + 4 / (128 * 128)


def ceil_to(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pow2_ceil(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()
