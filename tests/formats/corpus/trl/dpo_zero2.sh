# Follows huggingface/trl examples/scripts/dpo.py (commit 004c86793d6698f370d31a562f1c67da124a1152), its usage docstring
# with `accelerate launch --config_file examples/accelerate_configs/deepspeed_zero2.yaml` in front, `--flag=value`
# forms and a `--no_*` switch, from the repository root.
accelerate launch --config_file examples/accelerate_configs/deepspeed_zero2.yaml \
    examples/scripts/dpo.py \
    --dataset_name=trl-lib/ultrafeedback_binarized \
    --model_name_or_path=Qwen/Qwen2-0.5B-Instruct \
    --per_device_train_batch_size 4 \
    --learning_rate 5e-7 \
    --gradient_accumulation_steps 1 \
    --logging_steps 10 \
    --eval_steps 500 \
    --output_dir="Qwen2-0.5B-DPO" \
    --warmup_steps 150 \
    --report_to none \
    --bf16 \
    --logging_first_step \
    --no_remove_unused_columns
