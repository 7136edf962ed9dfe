"""Load the model catalog (TOML data files beside this module) and resolve model names (GPUs: gpu_catalog.py).

A model name resolves by hub id or alias, case-insensitively, with or without the org; a path to a
local `config.json` (or a folder holding one) of a supported architecture works too, and so does a hub id the
catalog does not list, read through huggingface_hub (hub.py) when the extra is installed.
"""
from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field, fields, replace
from functools import cache
from pathlib import Path

from memfit.errors import MemfitError
from memfit.facts.activation_table import activation_saved, known_activation
from memfit.facts import hub
# the GPU catalog lives in gpu_catalog.py; its names stay importable from here, where most callers look
from memfit.facts.gpu_catalog import GpuSpec, custom_gpu, find_gpu, gpus  # noqa: F401
from memfit.facts.names import norm, suggest, unknown_key

HERE = Path(__file__).parent / "data"

# Architecture keys and their defaults (README.md in this folder explains each).
ARCH_DEFAULTS: dict = {
    "norm": "rms",
    "norms_per_layer": 2,
    "qk_norm": "none",
    "qkv_bias": False,
    "o_bias": False,
    "mlp_bias": False,
    "lm_head_bias": False,
    "mlp": "gated",
    "position": "rope",
    "embedding_norm": False,
    "attention": "mha",
    "encoder_decoder": False,
    "final_norm": True,
    "norm_fp32_scale": False,
    "attn_softcap": False,
    "logit_softcap": False,
    "dropout": 0.0,
    "eager_repeats_kv": True,
    "eager_score_bytes": 0,
    "eager_softmax_in_input_dtype": False,
    "eager_qk_fp32": False,
    "eager_scores_kept": False, "eager_returns_probs": False,
    "sdpa_math": False,
    "sdpa_v_view": False,
    "has_sdpa": True,
    "has_flash": True,
    "hidden_act": "silu",
    "attention_dropout": -1.0,
    "learned_position_offset": 0,
}


@dataclass(frozen=True)
class ModelSpec:
    id: str
    arch: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool = False
    max_position_embeddings: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    published_params: int | None = None
    quantization: str | None = None
    gptq_group_size: int = 128
    gptq_desc_act: bool = False  # the checkpoint's act-order flag (quantize_config), recorded; no memory effect modelled
    aliases: tuple[str, ...] = ()
    params_source: str = ""
    config_source: str = ""
    config_file: str = ""  # the config.json this spec was read from (trace builds from the file itself)
    # structural facts (from architectures.toml, overridable per model)
    norm: str = "rms"
    norms_per_layer: int = 2
    qk_norm: str = "none"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    lm_head_bias: bool = False
    mlp: str = "gated"
    position: str = "rope"
    embedding_norm: bool = False
    attention: str = "mha"
    encoder_decoder: bool = False
    final_norm: bool = True
    norm_fp32_scale: bool = False
    attn_softcap: bool = False
    logit_softcap: bool = False
    dropout: float = 0.0
    eager_repeats_kv: bool = True
    eager_score_bytes: int = 0
    # without autocast, what eager attention keeps where it leaves dtypes to autocast: a softmax with no dtype=
    # (GPT-2: the probabilities stay in the scores' dtype) and q/k upcast to fp32 before QK^T (GPT-J); CUDA autocast
    # runs softmax in fp32 and casts matmul inputs back to bf16, so under autocast both read as the Llama path
    eager_softmax_in_input_dtype: bool = False
    eager_qk_fp32: bool = False
    eager_scores_kept: bool = False  # Falcon: the raw QK^T stays referenced beside the masked sum (architectures.toml)
    eager_returns_probs: bool = False  # Falcon: a layer's probabilities outlive it through the next layer's forward
    # SDPA gets k/v heads the fused kernels refuse (Falcon-7B's one broadcast kv head, no enable_gqa), so torch
    # runs its math kernel: fp32 scores, the fp32 softmax kept for backward
    sdpa_math: bool = False
    # SDPA saves v as a view of the fused qkv output (GPT-NeoX: qkv.view(...).chunk(3)), which keeps the q and k parts
    # of that output alive until backward (traced)
    sdpa_v_view: bool = False
    has_sdpa: bool = True  # transformers has an SDPA / flash-attention path for the family (its _supports_* flags)
    has_flash: bool = True
    hidden_act: str = "silu"  # the MLP activation (transformers ACT2FN name); activations.toml says what it saves
    attention_dropout: float = -1.0  # the attention-probability dropout; -1 = same as `dropout`
    learned_position_offset: int = 0  # extra rows of a learned position table (OPT: 2)
    assumed: tuple[str, ...] = ()  # facts guessed for a config.json of a family memfit does not know
    hub_param_count: int | None = None  # parameters in the hub checkpoint's safetensors, where known (a check)
    linear_names: dict = field(default_factory=dict, compare=False, hash=False)
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def attn_dropout(self) -> float:
        return self.dropout if self.attention_dropout < 0 else self.attention_dropout

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


_MODEL_FIELDS = {f.name for f in fields(ModelSpec)}


# keys of an architectures.toml family beyond the ModelSpec facts it sets for its models
_FAMILY_KEYS = {"hf_model_types", "config_keys", "config_switches", "peft_stacked_experts",
                "config_intermediate_divisor", "intermediate_default_multiple", "linear_names"}


@cache
def architectures() -> dict[str, dict]:
    with open(HERE / "architectures.toml", "rb") as f:
        data = tomllib.load(f)
    for name, family in data.items():
        for key in family:
            if key not in _MODEL_FIELDS and key not in _FAMILY_KEYS:
                raise unknown_key(f"architectures.toml [{name}]", key, _MODEL_FIELDS | _FAMILY_KEYS)
    return data


def _family_extras(family: dict) -> set[str]:
    """Keys a model of this family may carry beyond ModelSpec: what its config_keys and config_switches read
    (DeepSeek's MLA ranks, T5's decoder layers, ...), kept in ModelSpec.extra."""
    switched = {k for cases in family.get("config_switches", {}).values() for sets in cases.values() for k in sets}
    return (set(family.get("config_keys", {})) | switched) - _MODEL_FIELDS


def _build_model(entry: dict, source: str) -> ModelSpec:
    archs = architectures()
    arch = entry.get("arch")
    if arch not in archs:
        raise MemfitError(f"{source}: unknown architecture family {arch!r}; known: {', '.join(sorted(archs))}")
    family = archs[arch]
    merged = dict(ARCH_DEFAULTS)
    merged.update({k: v for k, v in family.items() if k in _MODEL_FIELDS})
    allowed = _MODEL_FIELDS | _family_extras(family)
    for key in entry:
        if key not in allowed:
            raise unknown_key(source, key, allowed)
    merged.update(entry)
    merged.setdefault("linear_names", family.get("linear_names", {}))
    if "head_dim" not in merged and "hidden_size" in merged and "num_heads" in merged:
        merged["head_dim"] = merged["hidden_size"] // merged["num_heads"]
    merged.setdefault("num_kv_heads", merged.get("num_heads"))
    known = {k: v for k, v in merged.items() if k in _MODEL_FIELDS}
    known["extra"] = {k: v for k, v in merged.items() if k not in _MODEL_FIELDS and k not in family}
    known["aliases"] = tuple(merged.get("aliases", ()))
    known["assumed"] = tuple(merged.get("assumed", ()))
    try:
        return ModelSpec(**known)
    except TypeError as e:
        raise MemfitError(f"{source}: incomplete model facts ({e})") from None


@cache
def models() -> tuple[ModelSpec, ...]:
    out: list[ModelSpec] = []
    for path in sorted((HERE / "models").glob("*.toml")):
        with open(path, "rb") as f:
            data = tomllib.load(f)
        out.extend(_build_model(entry, f"{path.name}:{entry.get('id')}") for entry in data.get("model", []))
    return tuple(out)


@cache
def _model_index() -> dict[str, ModelSpec]:
    index: dict[str, ModelSpec] = {}
    for m in models():
        for key in (m.id, m.id.split("/")[-1], *m.aliases):
            index.setdefault(norm(key), m)
    return index


def _is_local(name: str) -> bool:
    """Whether a model name is a path; a name the OS cannot even look up (too long, a NUL) is not one."""
    try:
        path = Path(name).expanduser()
        return path.is_dir() or path.suffix == ".json" or name.startswith((".", "/", "~"))
    except (OSError, ValueError, RuntimeError):  # RuntimeError: ~user of no such user
        return False


def find_model(name: str) -> ModelSpec:
    """A catalog model by id/alias, a local config.json / folder holding one, or a hub id the catalog lacks."""
    if _is_local(name):
        return model_from_config_file(Path(name).expanduser())
    index = _model_index()
    found = index.get(norm(name)) or index.get(norm(name.split("/")[-1]))
    if found:
        return as_named(found, name)
    if hub.looks_like_hub_id(name):
        try:
            return _hub_model(name.strip())
        except hub.HubError as e:
            raise MemfitError(f"unknown model {name!r}: not in the catalog; {e}{suggest(name, index)}") from None
    raise MemfitError(f"unknown model {name!r}{suggest(name, index)} (see `memfit models`, or pass a config.json)")


def as_named(model: ModelSpec, name: str) -> ModelSpec:
    """A catalog row found by a hub id it lists (an -Instruct alias of its base row) keeps the id the user gave:
    every header, title and exported file says that id; the row only supplies the architecture."""
    name = name.strip()
    return replace(model, id=name) if "/" in name and norm(name) != norm(model.id) else model


@cache  # once per process; huggingface_hub's own cache keeps the file across processes
def _hub_model(name: str) -> ModelSpec:
    """A hub repo's config.json read like a local one (every family rule and assumption applies), named by its id."""
    repo_id, revision = hub.split_id(name)
    config = hub.config_path(repo_id, revision)
    spec = model_from_config_file(config)
    return replace(spec, id=name, config_source=f"hub {repo_id}@{config.parent.name}",
                   hub_param_count=hub.param_count(repo_id, config))


def _config_file(path: Path) -> Path:
    return path / "config.json" if path.is_dir() else path


def _read_config(path: Path) -> dict:
    try:
        file = _config_file(path)
        found = file.is_file()
    except (OSError, ValueError):  # a path the OS refuses to look up (too long, a NUL byte)
        file, found = path, False
    if not found:
        raise MemfitError(f"cannot read model config {str(file)!r}: no such file (give a config.json or a folder holding one)")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MemfitError(f"malformed config.json {str(file)!r}: {e}") from None
    except RecursionError:
        raise MemfitError(f"malformed config.json {str(file)!r}: nested too deeply to be a model config") from None
    except ValueError as e:  # int() refuses numbers of more than 4300 digits
        raise MemfitError(f"malformed config.json {str(file)!r}: {str(e).split(':')[0]}") from None
    except OSError as e:
        raise MemfitError(f"cannot read model config {str(file)!r}: {e.strerror or e}") from None
    if not isinstance(data, dict):
        raise MemfitError(f"malformed config.json {str(file)!r}: expected a JSON object")
    encoders = {k: data[k] for k in config_reading()["encoder_keys"] if isinstance(data.get(k), dict)}
    if isinstance(data.get("text_config"), dict):  # multimodal wrappers (Gemma 3): the language model
        data = {**data["text_config"], "model_type": data["text_config"].get("model_type", data.get("model_type"))}
    return {**data, "_encoders": encoders}


def _dotted(data: dict, key: str):
    found: object = data
    for part in key.split("."):
        found = found.get(part) if isinstance(found, dict) else None
    return found


@cache
def config_reading() -> dict:
    """config_keys.toml: the config.json key names shared by most families, and quantization methods."""
    with open(HERE / "config_keys.toml", "rb") as f:
        return tomllib.load(f)


def _family_of(model_type) -> tuple[str, list[str]]:
    """The family of a config's model_type, and what is assumed when memfit does not know it."""
    for name, a in architectures().items():
        if model_type in a.get("hf_model_types", []):
            return name, []
    reading = config_reading()
    known = sorted({t for a in architectures().values() for t in a.get("hf_model_types", [])})
    if model_type in reading["not_decoders"]:
        raise MemfitError(f"unsupported architecture model_type={model_type!r}: not an attention decoder memfit can "
                          f"read; supported: {', '.join(known)}, or any Llama-style decoder")
    fallback = reading["unknown_family"]
    return fallback, [f"model_type {model_type!r} is not a family memfit knows: read as a {fallback}-style decoder "
                      f"(gated MLP, RMSNorm, separate q/k/v/o); check with `memfit trace` where transformers has it"]


def _read_keys(data: dict, family: dict) -> dict:
    keys = {**config_reading()["config_keys"], **family.get("config_keys", {})}
    entry = {}
    for ours, names in keys.items():
        value = next((v for v in (_dotted(data, k) for k in names) if v is not None), None)
        if value is not None:
            entry[ours] = value
    for key, cases in family.get("config_switches", {}).items():  # config flags that change the structure
        flags = [data.get(k) for k in key.split(",")]  # "a,b": the case is the JSON list of both values
        entry.update(cases.get(json.dumps(flags if len(flags) > 1 else flags[0]), {}))
    return entry


def _quantization(data: dict, where: str) -> dict:
    q = data.get("quantization_config")
    if q is None:
        return {}
    if not isinstance(q, dict):
        raise MemfitError(f"{where}: quantization_config must be a JSON object with a quant_method, got {q!r}")
    method = str(q.get("quant_method", "")).lower()
    bits = q.get("bits") or (4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") or method == "fp8" else None)
    known = config_reading()["quantization"]
    name = f"{method}-{bits}bit"
    if name not in known:
        raise MemfitError(f"{where}: quantization_config {method!r} with {bits} bits is not modelled; "
                          f"modelled: {', '.join(sorted(known))}")
    out = {"quantization": known[name]}
    group = q.get("group_size")
    if isinstance(group, int) and not isinstance(group, bool):
        if group != -1 and not 0 < group < _MAX_SIZE:  # -1: one group per row (GPTQ's "no grouping")
            raise _bad_value(where, "quantization_config.group_size", group, "-1 or a positive integer")
        out["gptq_group_size"] = group
    return out


# What a value read from a config.json must be, by the type of the ModelSpec field it fills. Sizes and counts
# are below 2^31 (no real config comes near; a bigger one is a typo that would overflow the float arithmetic).
_POSITIVE = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size", "intermediate_size")
_MAX_SIZE = 2**31
_FIELD_TYPES = {f.name: f.type for f in fields(ModelSpec)}


def _bad_value(path, key: str, value, what: str) -> MemfitError:
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return MemfitError(f"config {path}: {key} must be {what}, got {shown}")


def _check_types(entry: dict, path) -> None:
    """Every value read from the file has the type and range its field needs (one line naming the key)."""
    for key, value in entry.items():
        kind = _FIELD_TYPES.get(key, "int")  # family extras (num_decoder_layers, kv_lora_rank, ...) are counts
        low = 1 if key in _POSITIVE else 0
        if kind in ("int", "int | None"):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value < _MAX_SIZE:
                raise _bad_value(path, key, value, f"an integer from {low} to 2^31")
        elif kind == "bool" and not isinstance(value, bool):
            raise _bad_value(path, key, value, "true or false")
        elif kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 <= value <= 1):
            raise _bad_value(path, key, value, "a probability from 0 to 1")
        elif kind in ("str", "str | None") and not isinstance(value, str):
            raise _bad_value(path, key, value, "a string")


def model_from_config_file(path: Path) -> ModelSpec:
    data = _read_config(path)
    family, assumed = _family_of(data.get("model_type"))
    facts = architectures()[family]
    read = _read_keys(data, facts)
    entry: dict = {"id": str(path), "arch": family, "config_source": f"local {path}",
                   "config_file": str(_config_file(path)), **read, **_quantization(data, str(path))}
    divisor = facts.get("config_intermediate_divisor")
    if divisor and isinstance(entry.get("intermediate_size"), int):
        entry["intermediate_size"] //= divisor
    missing = [k for k in ("hidden_size", "num_layers", "num_heads", "vocab_size") if k not in entry]
    if missing:
        what = f"a {family} model" if not assumed else f"an unknown family (model_type {data.get('model_type')!r})"
        raise MemfitError(f"unsupported architecture: config {path} lacks {', '.join(missing)} for {what}")
    experts = [k for k in config_reading()["expert_keys"] if data.get(k)]
    if assumed and experts:  # a Llama reading would leave out the experts: far under, the costly error
        raise MemfitError(f"unsupported architecture model_type={data.get('model_type')!r}: a mixture of experts "
                          f"({experts[0]}) of a family memfit does not know; known MoE families: "
                          f"mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3")
    _check_types({k: entry[k] for k in read}, path)
    if "intermediate_size" not in entry:  # GPT-2 style n_inner null: the code uses a multiple of hidden
        multiple = facts.get("intermediate_default_multiple")
        if multiple is None:
            multiple = 4
            assumed.append(f"{path}: no intermediate size in config.json; assumed {multiple} x hidden")
        entry["intermediate_size"] = multiple * entry["hidden_size"]
    act = entry.get("hidden_act", facts.get("hidden_act", ARCH_DEFAULTS["hidden_act"]))
    if not known_activation(act):
        assumed.append(f"activation {act!r} is not in activations.toml: assumed it saves {activation_saved(act):g} "
                       f"input-sized tensors (the most of any known one)")
    entry["assumed"] = assumed + [_encoder_note(path, name, enc) for name, enc in data["_encoders"].items()]
    return _build_model(entry, str(path))


def _encoder_note(path, name: str, encoder: dict) -> str:
    """A vision / audio tower is not modelled: an under-estimate, said with the tower's rough size where the config
    gives its shape: its transformer blocks (attention 4 e^2 + MLP 2 e m per layer), not its embeddings or projector."""
    r = config_reading()
    depth, e, m = (next((encoder[k] for k in r[g] if isinstance(encoder.get(k), int)), None)
                   for g in ("encoder_depth", "encoder_width", "encoder_mlp"))
    m = m or (int(e * encoder["mlp_ratio"]) if e and isinstance(encoder.get("mlp_ratio"), (int, float)) else None)
    size = f" (at least about {depth * (4 * e * e + 2 * e * m) / 1e9:.2f}B parameters)" if depth and e and m else ""
    return (f"{path}: {name}: the model has an encoder tower{size} that memfit does not model: the estimate is the "
            "language model only, too low by the tower's weights, and by its gradients, optimizer states and "
            "activations when it is trained")
