# Follows huggingface/alignment-handbook recipes/zephyr-7b-beta/README.md: full SFT with ZeRO-3 from the
# repository root, here on 4 GPUs with a smaller micro-batch than the recipe (flags after the recipe win).
ACCELERATE_LOG_LEVEL=info accelerate launch \
    --config_file recipes/accelerate_configs/zero3.yaml \
    --num_processes=4 \
    scripts/sft.py \
    --config recipes/zephyr-7b-beta/sft/config_full.yaml \
    --per_device_train_batch_size=4 \
    --gradient_accumulation_steps=8
