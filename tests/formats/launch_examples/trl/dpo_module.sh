# Follows huggingface/trl docs/source/dpo_trainer.md / examples/scripts/dpo.py usage: a LoRA DPO on one GPU,
# started as a module.
python -m trl.scripts.dpo \
    --dataset_name trl-lib/ultrafeedback_binarized \
    --model_name_or_path Qwen/Qwen2-0.5B-Instruct \
    --learning_rate 5.0e-6 \
    --num_train_epochs 1 \
    --per_device_train_batch_size 2 \
    --gradient_accumulation_steps 8 \
    --gradient_checkpointing \
    --max_length 1024 \
    --use_peft \
    --lora_r 32 \
    --lora_alpha 16 \
    --output_dir Qwen2-0.5B-DPO \
    --no_remove_unused_columns
