"""A training run described as plain, validated data: the model, the machine, and every knob.

The knobs are the fields of `Scenario`, declared once in the knob table (data/knobs.toml, memfit/facts/
knobs.py) and written out with their types in scenario_fields.py (memfit/facts/knob_source.py writes it); this
module adds the rules that tie knobs together. Importers and the command line build a Scenario (through
memfit/facts/profiles.py::build_scenario); the estimate, the planner, the trace and the real-engine measurement
read it. Nothing here computes memory.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from memfit.errors import MemfitError
from memfit.facts.adapters import adapter_methods, method_info, trains_adapters, wraps
from memfit.facts.engines import engine_of
from memfit.facts.frameworks import autocast_over_fp32_gathers
from memfit.facts.hardware import Hardware
from memfit.facts.knobs import CONDITIONS, knobs
from memfit.facts.scenario_fields import ScenarioFields

__all__ = ["Hardware", "MODULES_TO_SAVE", "ROLE_GROUPS", "Scenario"]  # Hardware: facts/hardware.py, also here

ROLE_GROUPS = ("actor", "ref", "critic", "reward")
MODULES_TO_SAVE = ("embed_tokens", "lm_head")  # the model-level modules memfit's inventory names


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise MemfitError(message)


@dataclass(frozen=True)
class Scenario(ScenarioFields):
    """A run: `model`, `hardware`, every knob of data/knobs.toml as a field of the same name (typed in
    scenario_fields.py, written from the table), the framework `profile` whose defaults filled the unset knobs,
    the framework `releases` given ((package, version) pairs; empty = the pinned ones, data/releases.toml), what
    was `assumed` (memfit/facts/assumptions.py records), and the memory-relevant settings of the user's files
    that no reader could read (`unread`: each one line naming the setting; the verdict is then at most 'tight').

    What the knob table cannot say alone lives here: the rules between knobs, and facts derived from them."""

    def __post_init__(self) -> None:
        for k in knobs().values():
            k.check(getattr(self, k.name))
        self._check_engine()
        self._check_deepspeed()
        self._check_combinations()
        self._check_adapters()

    def _check_adapters(self) -> None:
        """PEFT methods other than LoRA take what their config classes take (data/adapters.toml)."""
        for name in self.modules_to_save:
            _require(name in MODULES_TO_SAVE, f"--modules-to-save {name!r} is not valid; choose from: "
                                              f"{', '.join(MODULES_TO_SAVE)}")
        _require(not self.modules_to_save or self.tuning in ("lora", "qlora") or wraps(self.tuning) == "linear",
                 f"--modules-to-save goes with LoRA or a Linear-wrapping PEFT method, not --tuning {self.tuning}")
        self._check_token_rows()
        if self.tuning not in adapter_methods():
            return
        _require(not self.dora, f"DoRA is a LoRA option; --tuning {self.tuning} has none (use --tuning lora --dora)")
        # an fp32 norm copy outputs fp32, and without autocast a 16-bit Linear refuses an fp32 input
        _require(not (self.tuning == "ln_tuning" and self.adapter_bytes == 4 and self.compute_bytes == 2
                      and not self.runs_autocast),
                 "LN tuning with fp32 norm copies and no autocast feeds fp32 into the 16-bit Linears (torch refuses "
                 "the dtype mix); use --adapter-dtype bf16 or a trainer that runs autocast")
        info = method_info(self.tuning)
        _require(self.lora_dropout == 0 or info.get("dropout", False),
                 f"--tuning {self.tuning} has no input dropout ({info.get('peft', info['description'].split(':')[0])}); "
                 "leave --lora-dropout at 0")

    def _check_token_rows(self) -> None:
        """PEFT trainable tokens: rows of the embedding, alone or beside LoRA (LoraConfig trainable_token_indices)."""
        rows, vocab = self.trainable_tokens, self.model.vocab_size
        _require(self.tuning != "trainable_tokens" or rows > 0,
                 "--tuning trainable_tokens needs the number of rows that train: --trainable-tokens N (PEFT "
                 "TrainableTokensConfig token_indices has no default)")
        _require(rows <= vocab, f"--trainable-tokens {rows} is more than the {vocab} rows of {self.model.id}'s "
                                "embedding")
        _require(not rows or self.tuning in ("lora", "qlora", "trainable_tokens"),
                 "--trainable-tokens goes with --tuning trainable_tokens or LoRA (LoraConfig "
                 f"trainable_token_indices), not --tuning {self.tuning}")
        # a tied head runs PEFT's layer only when called as a module: liger and TRL's chunked loss read lm_head.weight
        # (TRL refuses a PEFT layer there); the preference methods' log-prob paths are not modelled with it
        tied = rows and self.model.tie_embeddings
        _require(not tied or self.loss in ("standard", "inplace_ce") and self.method in ("sft", "pt"),
                 f"--trainable-tokens on {self.model.id} (its head is tied to the embedding) is modelled with "
                 f"--loss standard or inplace_ce and --method sft or pt, not --loss {self.loss} --method {self.method}")

    def _check_engine(self) -> None:
        stage, strategy = knobs()["zero_stage"], knobs()["fsdp_strategy"]
        if self.engine == "deepspeed":
            _require(self.zero_stage is not None, f"engine deepspeed needs a ZeRO stage ({stage.label} 0..3)")
        else:
            _require(self.zero_stage is None, f"{stage.label} {self.zero_stage} is a DeepSpeed setting but the "
                                              f"engine is {self.engine}; say one engine")
        if self.engine == "fsdp":
            _require(self.fsdp_strategy is not None, f"engine fsdp needs a sharding strategy ({strategy.label})")
        else:
            _require(self.fsdp_strategy is None, f"{strategy.label} {self.fsdp_strategy} is an FSDP setting but the "
                                                 f"engine is {self.engine}; say one engine")
        if self.engine == "single":
            _require(self.world_size == 1, f"engine 'single' runs one GPU but {self.world_size} were given; use ddp, "
                                           "deepspeed or fsdp")

    def _check_deepspeed(self) -> None:
        """The combinations DeepSpeed's own config refuses (runtime/zero/config.py, offload_config.py)."""
        if self.engine != "deepspeed":
            return
        _require(self.ratio == 1.0 or self.zero_stage == 3,
                 "DeepSpeed rejects offload ratio < 1 outside ZeRO-3 (config.py offload_ratio_check); use --zero 3")
        _require(self.ratio == 1.0 or self.offload_optimizer != "none",
                 "offload ratio needs optimizer offload; add --offload-optimizer cpu")
        _require(self.offload_param == "none" or self.zero_stage == 3,
                 "DeepSpeed rejects offload_param outside ZeRO-3 (parameter offload is a stage-3 feature); use --zero 3")
        _require(self.offload_optimizer == "none" or (self.zero_stage or 0) > 0,
                 "DeepSpeed rejects offload_optimizer with ZeRO-0 (offload needs stage 1, 2 or 3)")

    def _check_combinations(self) -> None:
        for role, n in self.role_gpus:
            _require(role in ROLE_GROUPS, f"--role-gpus role {role!r} is not valid; choose one of: "
                                          f"{', '.join(ROLE_GROUPS)}")
            _require(isinstance(n, int) and n > 0, f"--role-gpus {role} must be a positive integer, got {n!r}")
        gpu = self.hardware.gpu
        if self.attention == "flash":
            _require(gpu.compute_capability >= 8.0, f"flash-attention 2 rejects {gpu.name} (needs compute capability "
                                                    ">= 8.0, Ampere or newer); use --attn sdpa")
        if self.loss == "chunked_nll":
            _require(not self.uses_adapters or "lm_head" not in self.lora_targets,
                     "TRL rejects loss_type chunked_nll with LoRA on lm_head")
        _require(not (self.steps_in_backward and self.grad_accum > 1),
                 "optimizer_in_bwd steps each parameter inside backward, so torchtune's recipes refuse gradient "
                 "accumulation with it; use --grad-accum 1 or leave --optimizer-in-backward out")
        if self.precision.startswith("bf16"):
            _require(gpu.compute_capability >= 8.0, f"{gpu.name} has no bf16 support (transformers rejects bf16=True "
                                                    "below compute capability 8.0); use --precision fp16-mixed")

    # Derived facts the estimator needs often; small and obvious, so they live here.
    @property
    def world_size(self) -> int:
        return self.hardware.world_size

    @property
    def uses_adapters(self) -> bool:
        return trains_adapters(self.tuning)

    @property
    def steps_in_backward(self) -> bool:
        """optimizer_in_backward where it acts (the knob table's `needs`: full fine-tuning)."""
        return self.optimizer_in_backward and CONDITIONS[knobs()["optimizer_in_backward"].needs or "full"](self)

    def trains_whole(self, module: str) -> bool:
        """Whether the embedding / output head trains: full tuning, or PEFT's modules_to_save."""
        return self.tuning == "full" or self.uses_adapters and module in self.modules_to_save

    @property
    def virtual_tokens_in_use(self) -> int:
        """Positions prompt / p-tuning prepend to every row: the model runs seq_len + these."""
        return self.virtual_tokens if wraps(self.tuning) == "virtual_tokens" else 0

    @property
    def compute_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def adapter_bytes(self) -> int:
        """LoRA adapter storage: an engine that casts the whole module casts the adapters too (DeepSpeed)."""
        if self.precision == "fp32":
            return 4
        if engine_of(self).casts_module(self):
            return self.compute_bytes
        return 4 if self.adapter_dtype == "fp32" else 2

    @property
    def runs_autocast(self) -> bool:
        return engine_of(self).runs_autocast(self)

    @property
    def frozen_fp32_in_module(self) -> bool:
        """Frozen weights live in fp32 in the module: the model was built in fp32 and plain torch runs mixed
        precision over it (an engine that casts the module, DeepSpeed or FSDP, holds them in 16 bit; a framework's FSDP
        that gathers the fp32 params and autocasts, LitGPT lora.py's, is plain torch's case)."""
        return self.frozen_fp32 and (CONDITIONS["plain_mixed"](self) or autocast_over_fp32_gathers(self))

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch * self.seq_len

    def with_changes(self, **changes) -> "Scenario":
        return replace(self, **changes)
