# Qwen2.5-72B full fine-tune on one 8-GPU node with Adam offloaded to a 1.4 TB host
deepspeed --num_gpus 8 --module openrlhf.cli.train_sft \
   --pretrain Qwen/Qwen2.5-72B-Instruct \
   --dataset ./data/sft.jsonl \
   --input_key prompt \
   --output_key response \
   --max_len 4096 \
   --micro_train_batch_size 1 \
   --train_batch_size 64 \
   --zero_stage 3 \
   --adam_offload \
   --param_dtype bf16 \
   --attn_implementation flash_attention_2 \
   --gradient_checkpointing \
   --learning_rate 5e-6 \
   --save_path ./ckpt/qwen25-72b \
   --save_steps 500
