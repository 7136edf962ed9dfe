#!/usr/bin/env bash
# Follows hiyouga/LLaMA-Factory examples/README.md: `llamafactory-cli train` with key=value overrides after the
# YAML (LLaMA-Factory merges them over the file), on the GPUs CUDA_VISIBLE_DEVICES names.
MODEL_DIR=examples/train_lora
CUTOFF=4096

cd ../examples/llamafactory
CUDA_VISIBLE_DEVICES=0,1 llamafactory-cli train ${MODEL_DIR}/llama3_lora_sft.yaml \
    per_device_train_batch_size=2 \
    cutoff_len=$CUTOFF \
    learning_rate=5e-5   # a smaller learning rate for the longer rows
