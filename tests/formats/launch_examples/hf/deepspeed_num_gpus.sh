# Follows huggingface/transformers docs/source/en/deepspeed.md ("deepspeed --num_gpus=2 your_program.py <normal cl
# args> --deepspeed ds_config.json"), with the program's TrainingArguments flags.
cd ../../examples/hf
deepspeed --num_gpus=2 your_program.py --deepspeed ds_config_zero2.json --per_device_train_batch_size 4 \
  --gradient_accumulation_steps 4 --bf16 true --gradient_checkpointing --model_name_or_path meta-llama/Llama-3.1-8B \
  --output_dir out/llama-full --learning_rate 2e-5
