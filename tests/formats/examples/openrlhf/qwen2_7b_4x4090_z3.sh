# A user's one-command launch on 4x RTX 4090 (OpenRLHF 0.9.x flags)
deepspeed --num_gpus 4 --module openrlhf.cli.train_sft \
    --pretrain Qwen/Qwen2-7B-Instruct \
    --dataset ./data/sft.jsonl --input_key input --output_key output \
    --max_len 128 --micro_train_batch_size 4 --train_batch_size 64 \
    --zero_stage 3 --bf16 --attn_implementation flash_attention_2 \
    --gradient_checkpointing --learning_rate 1e-5 --save_path ./ckpt/qwen2-7b
