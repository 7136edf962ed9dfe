"""The HF Trainer callback on a tiny Llama built from a config (the Lightning callback: test_lightning.py)."""
import json

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[monitor])")

SEQ, BATCH = 16, 2


def test_hf_trainer_callback_writes_one_line_per_step_with_tokens(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from memfit.monitor import MemoryMonitorCallback

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 128, (3 * BATCH, SEQ))]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=BATCH, max_steps=3,
                             use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                             dataloader_num_workers=0)
    cb = MemoryMonitorCallback(tmp_path / "run.jsonl")
    Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=rows, callbacks=[cb]).train()
    lines = [json.loads(x) for x in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    assert all(x["tokens"] == BATCH * SEQ and x["allocated_bytes"] > 0 for x in lines)
    assert cb.monitor.errors == 0

