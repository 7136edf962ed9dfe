"""Issue 12: a vision / audio tower in a config.json is not dropped silently. memfit estimates the language model
and says, under assumptions, that the tower is left out (an under-estimate) with its rough size; the size is
checked against the tower the real transformers code builds from the same config (meta device, no weights)."""
import json

import pytest

from memfit.facts.catalog import find_model

QWEN2_VL = {"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl", "hidden_size": 3584,
            "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
            "vocab_size": 152064, "max_position_embeddings": 32768,
            "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "hidden_size": 3584,
                              "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}}
GEMMA3 = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
          "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                          "num_attention_heads": 8, "num_hidden_layers": 34, "num_key_value_heads": 4, "head_dim": 256,
                          "vocab_size": 262208},
          "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
                            "num_hidden_layers": 27, "num_attention_heads": 16, "image_size": 896, "patch_size": 14}}


def _real_tower_params(config: dict) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        if config["model_type"] == "qwen2_vl":
            from transformers.models.qwen2_vl import modeling_qwen2_vl as m

            cfg = transformers.Qwen2VLConfig(**config).vision_config
            tower = m.Qwen2VisionTransformerPretrainedModel._from_config(cfg)
        else:
            tower = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**config["vision_config"]))
    return sum(p.numel() for p in tower.parameters())


def _noted_billions(spec) -> float:
    notes = [a for a in spec.assumed if "encoder tower" in a]
    assert len(notes) == 1 and "vision_config" in notes[0] and "too low" in notes[0]
    return float(notes[0].split("at least about ")[1].split("B parameters")[0])


@pytest.mark.parametrize("config", [QWEN2_VL, GEMMA3], ids=["qwen2-vl-7b", "gemma-3-4b"])
def test_the_tower_is_named_with_a_size_the_real_code_does_not_undercut(tmp_path, config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    noted = _noted_billions(find_model(str(tmp_path)))
    real = _real_tower_params(config) / 1e9
    assert 0.85 * real <= noted <= real + 0.005  # "at least about": the blocks, not the patch embedding / merger


def test_a_text_only_config_gets_no_tower_note(tmp_path):
    config = {k: v for k, v in QWEN2_VL.items() if k != "vision_config"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert not [a for a in find_model(str(tmp_path)).assumed if "encoder tower" in a]
