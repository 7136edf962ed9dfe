#!/bin/bash
# Follows hiyouga/LLaMA-Factory examples/README.md ("Supervised Fine-Tuning on Multiple Nodes / with DeepSpeed
# ZeRO-3"): a multi-GPU LoRA SFT launched from the repository root with FORCE_TORCHRUN.
set -ex

# the repository root of the LLaMA-Factory layout (tests/formats/examples/llamafactory)
cd ../examples/llamafactory

export NPROC_PER_NODE=4
FORCE_TORCHRUN=1 llamafactory-cli train examples/train_lora/llama3_lora_sft_ds3.yaml

# after training: chat with and merge the adapter (not training launches)
llamafactory-cli chat examples/inference/llama3_lora_sft.yaml
llamafactory-cli export examples/merge_lora/llama3_lora_sft.yaml
