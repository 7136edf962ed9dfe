set -x

# OpenRLHF 0.9.2 - 0.10.1 flag style: --param_dtype and --attn_implementation
read -r -d '' training_commands <<EOF
openrlhf.cli.train_sft \
   --max_len 4096 \
   --dataset Open-Orca/OpenOrca \
   --input_key question \
   --output_key response \
   --train_batch_size 128 \
   --micro_train_batch_size 4 \
   --max_samples 500000 \
   --pretrain Qwen/Qwen2-7B-Instruct \
   --save_path ./checkpoint/qwen2-7b-sft \
   --save_steps -1 \
   --logging_steps 1 \
   --eval_steps -1 \
   --zero_stage 3 \
   --max_epochs 1 \
   --param_dtype bf16 \
   --attn_implementation flash_attention_2 \
   --learning_rate 5e-6 \
   --packing_samples \
   --gradient_checkpointing
EOF
    # --use_wandb [WANDB_TOKENS]

if [[ ${1} != "slurm" ]]; then
    deepspeed --module $training_commands
fi
