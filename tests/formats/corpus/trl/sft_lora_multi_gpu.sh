# Follows huggingface/trl examples/scripts/sft.py's LoRA usage (commit 004c86793d6698f370d31a562f1c67da124a1152 for the
# docstring form) launched over DDP with examples/accelerate_configs/multi_gpu.yaml on 4 of the GPUs.
accelerate launch --config_file examples/accelerate_configs/multi_gpu.yaml --num_processes 4 \
    examples/scripts/sft.py \
    --model_name_or_path meta-llama/Llama-3.1-8B \
    --dataset_name trl-lib/Capybara \
    --learning_rate 2.0e-4 \
    --num_train_epochs 1 \
    --per_device_train_batch_size 4 \
    --gradient_accumulation_steps 4 \
    --gradient_checkpointing \
    --max_length 2048 \
    --use_peft \
    --lora_r 32 \
    --lora_alpha 16 \
    --bf16 \
    --output_dir Llama-3.1-8B-SFT-LoRA
