"""memfit given only a config.json vs the trace of the real transformers code built from that same file.

    python bench/any_config.py                 # every architecture x 4 runs: table + summary
    python bench/any_config.py gpt2 opt        # some architectures

Each architecture's config.json is written by transformers' own config class (with the sizes of a real
checkpoint of that family, fewer layers to keep the trace short); memfit reads it as a user's file
(`--model path/to/config.json`), and the trace builds the model from the file with transformers
(`memfit/trace/build.py`), so the two share no reading of it. Compared: the allocated peak of the step
(weights, gradients, optimizer states, activations, logits/loss) and the activation peak. The targets of
issue 11 are printed beside the numbers: median <= 1%, max <= 4%, no refusals; under-predictions first.
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memfit.errors import MemfitError  # noqa: E402
from memfit.facts.catalog import find_gpu, find_model  # noqa: E402
from memfit.facts.profiles import build_scenario  # noqa: E402
from memfit.facts.scenario import Hardware  # noqa: E402
from memfit.roles.estimate import estimate  # noqa: E402

COMPARED = ("weights", "gradients", "optimizer_states", "activations", "logits_loss")
ACTIVATIONS = ("activations", "logits_loss")
PHASES = ("forward", "backward", "optimizer_step")
_DENSE = dict(hidden_size=1536, num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4,
              intermediate_size=4096, vocab_size=64000)
# model_type -> config arguments (the family's shapes; layers cut to keep a trace to seconds)
ARCHITECTURES: dict[str, dict] = {
    "llama": dict(hidden_size=2048, num_hidden_layers=8, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True),  # Llama-3.2-1B
    "mistral": dict(hidden_size=4096, num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8,
                    intermediate_size=14336, vocab_size=32000),  # Mistral-7B v0.1 / v0.2
    "gemma": dict(hidden_size=2048, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=1, head_dim=256,
                  intermediate_size=16384, vocab_size=256000),  # Gemma-2B
    "phi": dict(hidden_size=2560, num_hidden_layers=8, num_attention_heads=32, intermediate_size=10240,
                vocab_size=51200, partial_rotary_factor=0.4),  # phi-2
    "stablelm": dict(hidden_size=2048, num_hidden_layers=8, num_attention_heads=32, num_key_value_heads=32,
                     intermediate_size=5632, vocab_size=100352, use_qkv_bias=True,
                     partial_rotary_factor=0.25),  # StableLM-2-1.6B
    "gpt2": dict(n_embd=1024, n_layer=8, n_head=16, vocab_size=50257, n_positions=1024),  # gpt2-medium
    "gpt_neox": dict(hidden_size=2048, num_hidden_layers=8, num_attention_heads=8, intermediate_size=8192,
                     vocab_size=50304, rotary_pct=0.25, max_position_embeddings=2048),  # Pythia-1B
    "opt": dict(hidden_size=2048, num_hidden_layers=8, num_attention_heads=32, ffn_dim=8192, vocab_size=50272,
                max_position_embeddings=2048, word_embed_proj_dim=2048),  # OPT-1.3B
    "gptj": dict(n_embd=4096, n_layer=4, n_head=16, rotary_dim=64, vocab_size=50400, n_positions=2048),  # GPT-J-6B
    "gpt_bigcode": dict(n_embd=2048, n_layer=8, n_head=16, n_inner=None, vocab_size=49280, n_positions=2048,
                        multi_query=True),  # SantaCoder-like, n_inner null
    "bloom": dict(hidden_size=1536, n_layer=8, n_head=16, vocab_size=250880),  # BLOOM-1b1
    "mixtral": dict(_DENSE, num_local_experts=8, num_experts_per_tok=2),
    "qwen3_moe": dict(_DENSE, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=1024),
    "glm": dict(_DENSE, vocab_size=151552),  # GLM-4-9B-chat-hf vocabulary (the config's pad id lies past 64000)
    "glm4": dict(_DENSE, vocab_size=151552),  # GLM-4-0414 vocabulary
    "gemma3_text": dict(_DENSE, head_dim=128),
    "hunyuan_v1_dense": dict(_DENSE, head_dim=128),  # the config class leaves head_dim None (the model needs it)
    "smollm3": dict(hidden_size=2048, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                    intermediate_size=11008, vocab_size=128256),  # SmolLM3-3B (tied)
    **{t: dict(_DENSE) for t in ("qwen2", "qwen3", "phi3", "olmo", "olmo2", "starcoder2", "helium", "granite",
                                 "ernie4_5", "exaone4", "olmo3", "seed_oss")},
}
# Families whose config.json memfit does not yet read to the exact parameter count of the real model (the
# test would fail), or whose activations the estimate cannot follow yet; printed as gaps, not compared. Unknown
# families are read as Llama-style decoders.
GAPS = {
    "falcon": "parameters now exact (multi_query -> one kv head); activations far off: FalconAttention passes one "
              "broadcast kv head to SDPA without enable_gqa, so CUDA runs the math kernel (T^2 scores saved, memfit "
              "50-85% under), and its eager path keeps a bf16 softmax without repeat_kv (memfit ~50-60% over)",
    "ministral": "unknown family; its config class leaves rope parameters the trace cannot build",
    "cohere": "unknown family (LayerNorm without bias, parallel block): read as Llama, over",
    "nemotron": "unknown family (relu2 up/down MLP, LayerNorm1p): read as Llama",
    "arcee": "unknown family (relu2 up/down MLP): read as Llama, over",
    "apertus": "unknown family (xIELU up/down MLP): read as Llama, over",
}
# (tuning, checkpointing, micro-batch, sequence length, attention): where activations decide the peak
RUNS = (("full", "off", 2, 2048, "sdpa"), ("lora", "off", 4, 1024, "eager"), ("lora", "full", 1, 8192, "sdpa"),
        ("full", "full", 4, 4096, "sdpa"))


def write_config(folder: Path, model_type: str) -> Path:
    """config.json as transformers itself writes it for this family."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = CONFIG_MAPPING[model_type](**ARCHITECTURES[model_type])
    path = folder / "config.json"
    path.write_text(json.dumps(config.to_dict()))
    return path


def scenario(config_path: Path, run: tuple):
    tuning, ckpt, batch, seq, attn = run
    knobs = {"engine": "single", "precision": "bf16-pure", "optimizer": "adamw-foreach", "tuning": tuning,
             "checkpointing": ckpt, "micro_batch": batch, "seq_len": seq, "attention": attn}
    return build_scenario(find_model(str(config_path)), Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=1), knobs)


def _peak(phases: dict, parts: tuple[str, ...]) -> int:
    return max(sum(phases[p].get(c) for c in parts) for p in PHASES if p in phases)


@dataclass
class Row:
    model_type: str
    run: tuple
    estimate: int = 0
    trace: int = 0
    est_act: int = 0
    trace_act: int = 0
    error: str = ""

    @property
    def pct(self) -> float:
        return 100.0 * (self.estimate - self.trace) / self.trace

    @property
    def act_pct(self) -> float:
        return 100.0 * (self.est_act - self.trace_act) / self.trace_act


def compare(model_type: str, run: tuple, folder: Path) -> Row:
    from memfit.trace.run import run_trace

    row = Row(model_type, run)
    try:
        s = scenario(write_config(folder / model_type, model_type), run)
        e = estimate(s).allocated.phases
        t = run_trace(s).profile.phases
    except MemfitError as err:
        row.error = str(err)
        return row
    row.estimate, row.trace = _peak(e, COMPARED), _peak(t, COMPARED)
    row.est_act, row.trace_act = _peak(e, ACTIVATIONS), _peak(t, ACTIVATIONS)
    return row


def main(argv: list[str]) -> int:
    types = argv or list(ARCHITECTURES)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in types:
            for run in RUNS:
                row = compare(model_type, run, Path(tmp))
                rows.append(row)
                label = "/".join(map(str, run))
                if row.error:
                    print(f"{model_type:18} {label:28} refused: {row.error}", flush=True)
                else:
                    print(f"{model_type:18} {label:28} est {row.estimate / 2**30:7.2f} GiB  trace "
                          f"{row.trace / 2**30:7.2f} GiB  total {row.pct:+6.1f}%  activations {row.act_pct:+6.1f}%",
                          flush=True)
    for model_type, gap in GAPS.items():
        print(f"{model_type:18} not compared: {gap}")
    ok = [r for r in rows if not r.error]
    errors = [abs(r.pct) for r in ok]
    under = sum(r.pct < -1 for r in ok)
    print(f"\n{len(types)} architectures, {len(ok)} of {len(rows)} runs answered; total peak |error| median "
          f"{statistics.median(errors):.2f}% (target <= 1), max {max(errors):.2f}% (target <= 4); "
          f"{under} under-predicted by more than 1%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
