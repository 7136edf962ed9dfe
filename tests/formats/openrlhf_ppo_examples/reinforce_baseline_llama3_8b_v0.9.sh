# REINFORCE++-baseline: no critic; actor, reference, reward model and vLLM share 8 GPUs, legacy flags.
# Modelled on github.com/OpenRLHF/OpenRLHF examples/scripts/train_reinforce_baseline_llama_ray_hybrid_engine.sh
# at tag v0.9.1 (commit ac18582b815b51073d13ae54ba7e5c7a67658067).
ray job submit --address="http://127.0.0.1:8265" \
   --runtime-env-json='{"working_dir": "/openrlhf"}' \
   -- python3 -m openrlhf.cli.train_ppo_ray \
   --actor_num_nodes 1 --actor_num_gpus_per_node 8 \
   --ref_num_nodes 1 --ref_num_gpus_per_node 8 \
   --reward_num_nodes 1 --reward_num_gpus_per_node 8 \
   --colocate_all_models \
   --vllm_num_engines 4 \
   --vllm_tensor_parallel_size 2 \
   --vllm_gpu_memory_utilization 0.6 \
   --vllm_enable_sleep \
   --deepspeed_enable_sleep \
   --advantage_estimator reinforce_baseline \
   --pretrain OpenRLHF/Llama-3-8b-sft-mixture \
   --reward_pretrain OpenRLHF/Llama-3-8b-rm-700k \
   --micro_train_batch_size 4 \
   --train_batch_size 128 \
   --micro_rollout_batch_size 8 \
   --rollout_batch_size 128 \
   --n_samples_per_prompt 8 \
   --init_kl_coef 1e-3 \
   --use_kl_loss \
   --kl_estimator k2 \
   --prompt_max_len 1024 \
   --generate_max_len 1024 \
   --zero_stage 3 \
   --bf16 \
   --attn_implementation flash_attention_2 \
   --gradient_checkpointing \
   --packing_samples
