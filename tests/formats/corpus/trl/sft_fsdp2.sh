# Follows huggingface/trl docs/source/distributing_training.md and examples/scripts/sft.py's usage (commit
# a91c73c661285796de59614309a3079bd430b7f4 for fsdp2.yaml): full SFT sharded with FSDP2 on 8 GPUs.
accelerate launch --config_file examples/accelerate_configs/fsdp2.yaml \
    examples/scripts/sft.py \
    --model_name_or_path Qwen/Qwen2.5-7B \
    --dataset_name trl-lib/Capybara \
    --learning_rate 2.0e-5 \
    --num_train_epochs 1 \
    --per_device_train_batch_size 2 \
    --gradient_accumulation_steps 8 \
    --gradient_checkpointing \
    --max_length 4096 \
    --bf16 \
    --output_dir Qwen2.5-7B-SFT
