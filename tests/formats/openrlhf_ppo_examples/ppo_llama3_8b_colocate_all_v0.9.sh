# PPO with every model and the vLLM engines on the same 8 GPUs (hybrid engine), legacy flags.
# Modelled on github.com/OpenRLHF/OpenRLHF examples/scripts/train_ppo_llama_ray_hybrid_engine.sh
# at tag v0.9.1 (commit ac18582b815b51073d13ae54ba7e5c7a67658067); paths and learning rates trimmed.
python3 -m openrlhf.cli.train_ppo_ray \
   --actor_num_nodes 1 --actor_num_gpus_per_node 8 \
   --ref_num_nodes 1 --ref_num_gpus_per_node 8 \
   --critic_num_nodes 1 --critic_num_gpus_per_node 8 \
   --reward_num_nodes 1 --reward_num_gpus_per_node 8 \
   --colocate_all_models \
   --vllm_num_engines 4 \
   --vllm_tensor_parallel_size 2 \
   --vllm_gpu_memory_utilization 0.5 \
   --vllm_enable_sleep \
   --deepspeed_enable_sleep \
   --enforce_eager \
   --pretrain OpenRLHF/Llama-3-8b-sft-mixture \
   --reward_pretrain OpenRLHF/Llama-3-8b-rm-700k \
   --micro_train_batch_size 4 \
   --train_batch_size 128 \
   --micro_rollout_batch_size 8 \
   --rollout_batch_size 1024 \
   --prompt_max_len 1024 \
   --generate_max_len 1024 \
   --zero_stage 3 \
   --bf16 \
   --init_kl_coef 0.01 \
   --prompt_data OpenRLHF/prompt-collection-v0.1 \
   --apply_chat_template \
   --gradient_checkpointing \
   --packing_samples
