"""The host side of a step: transfers over the GPU's host link and the offloaded optimizer on the CPU.

- A rank's host link: its PCIe rate (pinned; pageable copies go through a bounce buffer at a fraction), but the
  GPUs of one node share the host: each gets at most host_node_gbps / GPUs per node when all copy at once.
- The CPU optimizer: parameters per second per thread by implementation (measured, tools/measure_cpu_adam.py),
  times the threads one rank's optimizer gets from its launcher (torchrun: one, unless the node has one GPU;
  torchtune: the node's threads / ranks; the deepspeed launcher: all, shared by the node's ranks), and at most
  the node's memory bandwidth over the bytes each update moves, shared by the node's ranks.
"""
from __future__ import annotations

from memfit.facts.engines import Sharding, engine_of
from memfit.facts.recompute import Recompute
from memfit.facts.scenario import Scenario
from memfit.memory.inventory import scenario_tensors
from memfit.memory.states.common import partition_sizes
from memfit.planner.speed_constants import GB, assumptions


def host_link(s: Scenario, pinned: bool) -> float:
    """Bytes per second one rank moves to or from the host while every rank of its node does the same."""
    o = assumptions()["offload"]
    gbps = o["host_link_gbps"].get(s.hardware.gpu.speed_id, o["host_link_gbps"]["default"])
    gbps = min(gbps, o["host_node_gbps"] / s.hardware.gpus_per_node)
    return gbps * GB * (1.0 if pinned else o["pageable_fraction"])


def cpu_implementation(s: Scenario) -> str:
    """The CPU optimizer an offloaded step runs: DeepSpeedCPUAdam, or torch AdamW of the optimizer knob's kind."""
    if engine_of(s).cpu_optimizer(s) == "cpu_adam_params_per_second":
        return "deepspeed_cpu_adam"
    table = assumptions()["cpu_optimizer"]["per_thread"]
    return s.optimizer if s.optimizer in table else "adamw-loop"


def rank_threads(s: Scenario) -> float:
    """Threads one rank's optimizer step runs on (a share, when the node's ranks split them)."""
    c = assumptions()["cpu_optimizer"]
    g = s.hardware.gpus_per_node
    node = c["threads_per_gpu"] * g
    launcher = c["launcher"].get(s.profile, c["launcher"]["default"])
    if launcher == "torchrun" and g > 1:
        return 1.0  # OMP_NUM_THREADS=1 for each of several ranks (torch/distributed/run.py)
    return node / g  # torchtune's share, or all threads shared by the ranks


def cpu_update_rate(s: Scenario) -> float:
    """Parameters per second one rank's CPU optimizer updates while the node's other ranks do the same."""
    c = assumptions()["cpu_optimizer"]
    compute = c["per_thread"][cpu_implementation(s)] * rank_threads(s)
    memory = c["host_memory_gbps"] * GB / c["bytes_per_update"] / s.hardware.gpus_per_node
    return min(compute, memory)


def optimizer_and_offload(s: Scenario, trainable: int, total: int, bandwidth: float,
                          checkpointed: float) -> tuple[dict[str, float], dict[str, float]]:
    """(per micro-step, per step) seconds of optimizer work and host transfers."""
    a = assumptions()
    o = a["offload"]
    n = s.world_size
    engine = engine_of(s)
    local = trainable / n if engine.sharding(s) >= Sharding.OPTIMIZER else trainable
    gpu_bytes = a["optimizer"].get(s.optimizer, 28)
    micro: dict[str, float] = {}
    step: dict[str, float] = {}
    host_share = 0.0
    traffic = engine.offload_traffic(s)
    if engine.optimizer_offload(s) != "none":
        host_share = 1.0 - engine.optimizer_gpu_share(s, partition_sizes(s, scenario_tensors(s)))
        link = host_link(s, engine.pinned(s))
        micro["offload_transfer"] = local * host_share * traffic.grad_bytes_down / link * o["exposed_transfer"]
        if traffic.param_bytes_up:
            step["offload_transfer"] = local * host_share * traffic.param_bytes_up / link
        step["cpu_optimizer"] = local * host_share / cpu_update_rate(s)
    if traffic.weight_fetches:  # offloaded weights are always pinned (memfit/memory/states)
        fetch = traffic.weight_fetches * (total / n) * s.compute_bytes / host_link(s, True)
        micro["offload_transfer"] = micro.get("offload_transfer", 0.0) + fetch * o["exposed_param_fetch"]
    gpu_step = local * (1.0 - host_share) * gpu_bytes / bandwidth
    if s.steps_in_backward:
        gpu_step *= 1.0 - a["optimizer"]["in_backward_hidden"]
    step["optimizer"] = gpu_step
    if Recompute.of(s.checkpointing).on_host:
        ckpt_bytes = (s.tokens_per_micro_batch * s.model.hidden_size * s.compute_bytes * s.model.num_layers
                      * checkpointed)
        micro["activation_offload"] = 2 * ckpt_bytes / host_link(s, s.checkpointing == "offload") \
            * o["exposed_activation_offload"]
    return micro, step
