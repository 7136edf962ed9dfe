"""DPO / IPO on the real DeepSpeed engine, the way OpenRLHF's train_dpo builds it.

Two engines per rank: the policy (`DeepSpeedRunner`: the scenario's ZeRO stage, optimizer, bf16) and the
frozen reference, a DeepSpeed inference engine from `get_eval_ds_config` (openrlhf/utils/deepspeed/
deepspeed_utils.py): bf16, ZeRO stage 3 when the policy runs stage 3 (built under zero.Init, as
HfDeepSpeedConfig makes from_pretrained do) and stage 0 (a full replica) otherwise, offload_param only
with --ref-offload. OpenRLHF loads the reference even with LoRA. The step is the trace's
(`memfit.trace.dpo`): policy forward on chosen + rejected rows, fp32 logits into flash_attn's cross
entropy (stand-in), reference forward under no_grad, DPO loss, the policy engine's backward and step.
Only the policy is checkpointed (DPOTrainer saves `self.model`).
"""
from __future__ import annotations

import torch

from memfit.errors import MemfitError
from memfit.facts.engines.deepspeed import eval_config
from memfit.measure.deepspeed_runner import DeepSpeedRunner, clear_zero3_release_cache
from memfit.measure.model import build_model
from memfit.facts.scenario import Scenario
from memfit.trace.dpo import PreferenceBatch, concatenated_forward, dpo_loss, reference_kind, reference_scenario


def reference_config(s: Scenario) -> dict:
    """OpenRLHF's get_eval_ds_config for the reference engine (memfit/facts/engines/deepspeed.py)."""
    return eval_config(s, offload=s.ref_offload) | {"steps_per_print": 10**9}


class DpoRunner(DeepSpeedRunner):
    """OpenRLHF DPO: the policy engine plus a reference inference engine on every rank."""

    ref_engine = None

    def build(self):
        """train_dpo.py order: the policy's and the reference's Actor load (both on the host, or both partitioned
        under zero.Init), then strategy.prepare initializes the policy engine, then the reference engine."""
        import deepspeed

        if reference_kind(self.s) != "separate":
            raise MemfitError("measure runs OpenRLHF's DPO (a separate reference engine); use --profile openrlhf")
        config = reference_config(self.s)
        model = self._reference_model(config)
        super().build()
        self.ref_engine, *_ = deepspeed.initialize(model=model, config=config)

    def _reference_model(self, config: dict):
        import deepspeed

        stage3 = config["zero_optimization"]["stage"] == 3
        init = deepspeed.zero.Init(config_dict_or_path=config, dtype=torch.bfloat16) if stage3 else None
        tk = self.tk
        recording = tk.record
        tk.context = None if stage3 else "build"  # host RAM until the engine moves it (as Runner._build)
        tk.record = recording and stage3
        try:
            model, _, _ = build_model(reference_scenario(self.s), "cpu", init, self.model_dir)
        finally:
            tk.context = None
            tk.record = recording
            tk.set_phase(tk.phase)
        model.eval()  # DPOTrainer.fit: self.ref_model.eval()
        self._install_hooks(model)
        return model

    def forward(self, batch):
        """DPOTrainer.fit: policy forward, then the reference's under no_grad, then DPOLoss. The measure batch has
        two [micro_batch, seq] tensors: input_ids serve as the chosen rows, labels (a copy) as the rejected."""
        chosen, rejected = batch["input_ids"], batch["labels"]
        ones = torch.ones_like(chosen)
        pb = PreferenceBatch(chosen, ones, rejected, ones.clone(), [chosen.shape[1] // 4] * chosen.shape[0],
                             None, None)
        policy_chosen, policy_rejected, _ = concatenated_forward(self.engine, pb)
        with torch.no_grad():
            ref_chosen, ref_rejected, _ = concatenated_forward(self.ref_engine, pb)
        return dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, self.s.method == "ipo")

    def walk(self):
        super().walk()
        if self.ref_engine is None:
            return
        offload = self.ref_engine.zero_optimization_stage() == 3 and self.s.ref_offload
        for p in self.ref_engine.module.parameters():
            if getattr(p, "ds_tensor", None) is not None:
                if p.data.numel() > 0:  # gathered / persistent while in use
                    self.tk.claim(p.data, "weights", "device", "ref.zero3.gathered_params")
                self.tk.claim(p.ds_tensor, "weights", "host" if offload else "device", "ref.zero3.param_partitions")
            else:
                self.tk.claim(p.data, "weights", "device", "ref.module.params")
        for b in self.ref_engine.module.buffers():
            self.tk.claim(b, "weights", "device", "ref.module.buffers")

    def close(self):
        engine, self.ref_engine = self.ref_engine, None
        if engine is not None:
            engine.destroy()
            from deepspeed.runtime.zero import parameter_offload

            parameter_offload.FWD_MODULE_STACK[:] = [m for m in parameter_offload.FWD_MODULE_STACK
                                                     if m is not engine.module]
            clear_zero3_release_cache()
        super().close()
