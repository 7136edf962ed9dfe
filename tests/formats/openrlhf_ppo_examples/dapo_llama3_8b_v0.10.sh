# DAPO (group_norm advantages, dynamic filtering, clip-higher) with a rule-based remote reward: actor and
# reference colocated with 4 vLLM engines x TP 2 on 8 GPUs; OpenRLHF 0.9.2-0.10.1 flags (--param_dtype, --max_len).
# Modelled on github.com/OpenRLHF/OpenRLHF examples/scripts/train_dapo_ray_hybrid_engine.sh
# at tag v0.10.1 (commit 33f9d72fbac7ada09979fd0873c27b1cca0cc0e1).
python3 -m openrlhf.cli.train_ppo_ray \
   --ref_num_nodes 1 --ref_num_gpus_per_node 8 \
   --actor_num_nodes 1 --actor_num_gpus_per_node 8 \
   --vllm_num_engines 4 \
   --vllm_tensor_parallel_size 2 \
   --colocate_all_models \
   --vllm_gpu_memory_utilization 0.6 \
   --vllm_enable_sleep \
   --deepspeed_enable_sleep \
   --init_kl_coef 1e-3 \
   --use_kl_loss \
   --kl_estimator k3 \
   --advantage_estimator group_norm \
   --dynamic_filtering \
   --dynamic_filtering_reward_range 0 1 \
   --eps_clip_low_high 0.2 0.27 \
   --pretrain OpenRLHF/Llama-3-8b-sft-mixture \
   --remote_rm_url /openrlhf/examples/python/reward_func.py \
   --micro_train_batch_size 8 \
   --train_batch_size 128 \
   --micro_rollout_batch_size 16 \
   --rollout_batch_size 128 \
   --n_samples_per_prompt 8 \
   --max_len 2048 \
   --zero_stage 3 \
   --param_dtype bf16 \
   --gradient_checkpointing \
   --packing_samples
