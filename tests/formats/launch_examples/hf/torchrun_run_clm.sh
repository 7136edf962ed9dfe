#!/bin/bash
# Follows huggingface/transformers examples/pytorch/language-modeling/README.md (run_clm.py) with the DeepSpeed
# file of docs/source/en/deepspeed.md: torchrun on one node, TrainingArguments flags, ZeRO-2 from a JSON.
cd "$(dirname "$0")"
cd ../../examples/hf

torchrun --nproc_per_node=4 --nnodes 1 run_clm.py \
    --model_name_or_path Qwen/Qwen2.5-1.5B \
    --dataset_name wikitext \
    --dataset_config_name wikitext-2-raw-v1 \
    --per_device_train_batch_size 4 \
    --gradient_accumulation_steps 4 \
    --bf16 \
    --gradient_checkpointing \
    --deepspeed ds_config_zero2.json \
    --block_size 1024 \
    --do_train \
    --output_dir /tmp/test-clm
