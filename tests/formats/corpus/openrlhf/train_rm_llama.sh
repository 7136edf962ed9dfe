set -x

# Follows OpenRLHF/OpenRLHF examples/scripts/train_rm_llama.sh (commit 1161172acb36201755df2d8dacbd3f2435cceb99 for the
# flags; the module launch of the later scripts): a reward model with ZeRO-3, OpenRLHF <= 0.8.9 flag style (--bf16)
read -r -d '' training_commands <<EOF2
openrlhf.cli.train_rm \
   --save_path ./checkpoint/llama2-7b-rm \
   --train_batch_size 128 \
   --micro_train_batch_size 1 \
   --pretrain meta-llama/Llama-2-7b-chat-hf \
   --bf16 \
   --max_len 1536 \
   --zero_stage 3 \
   --learning_rate 9e-6 \
   --dataset Anthropic/hh-rlhf \
   --chosen_key chosen \
   --rejected_key rejected \
   --flash_attn \
   --gradient_checkpointing
EOF2

if [[ ${1} != "slurm" ]]; then
    deepspeed --module $training_commands
fi
