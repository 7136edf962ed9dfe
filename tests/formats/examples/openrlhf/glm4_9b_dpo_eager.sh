# GLM-4-9B DPO on one node of 8 A100-80GB (OpenRLHF 0.10 flags): OOM after some steps at max length 2048 with
# eager attention (user report: global batch 128, micro-batch 1; the max length is issue 12's)
deepspeed --num_gpus 8 --module openrlhf.cli.train_dpo \
   --pretrain THUDM/glm-4-9b-chat \
   --dataset OpenRLHF/preference_dataset_mixture2_and_safe_pku \
   --apply_chat_template \
   --chosen_key chosen \
   --rejected_key rejected \
   --max_len 2048 \
   --micro_train_batch_size 1 \
   --train_batch_size 128 \
   --zero_stage 3 \
   --param_dtype bf16 \
   --attn_implementation eager \
   --gradient_checkpointing \
   --beta 0.1 \
   --learning_rate 5e-7 \
   --save_path ./checkpoint/glm4-9b-dpo
