"""--lengths DATA beyond text files: Parquet, a save_to_disk folder, a dataset name (offline here), and raw text
counted with the model's tokenizer. The tokenizer is built here with the `tokenizers` library (no hub); its counts
must be what TRL's SFT tokenization gets through transformers' own loading of the same folder."""
import json

import pytest

from memfit.errors import MemfitError
from memfit.interfaces.cli.main import main
from memfit.interfaces.lengths.read import read_lengths

TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 688, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4,
              "vocab_size": 300, "max_position_embeddings": 4096, "hidden_act": "silu", "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, the memory of a GPU"] * 20
TEXTS = ["hello world", "the lazy dog</s>", "über 漢字 fox, a GPU's memory " * 7, "x"]
KNOBS = ["--gpu", "a100-80gb", "--gpus", "2", "--micro-batch", "2", "--seq", "512"]


@pytest.fixture
def model_dir(tmp_path):
    """A model folder: config.json, a BPE tokenizer.json with a BOS post-processor, tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "bos_token": "<s>",
                                                              "tokenizer_class": "PreTrainedTokenizerFast"}))
    return folder


def _trl_counts(folder, rows):
    """What TRL's SFTTrainer tokenizes: EOS appended to text / completion unless there, then trl's _tokenize."""
    from transformers import AutoTokenizer
    from trl.data_utils import _tokenize

    tok = AutoTokenizer.from_pretrained(str(folder))
    eos = tok.eos_token
    out = []
    for r in rows:
        text = r["text"] if "text" in r else r["prompt"] + r["completion"]
        out.append(len(_tokenize(tok, text if text.endswith(eos) else text + eos)["input_ids"]))
    return out


def test_raw_text_counts_as_trl_counts(tmp_path, model_dir):
    from memfit.facts.catalog import find_model
    from memfit.facts.versions import installed, pinned
    from memfit.interfaces.lengths.text import COUNTED_AS

    name, release = COUNTED_AS
    assert pinned()[name] == release == installed()[name]  # the rule was read in the release compared against

    rows = [{"text": t} for t in TEXTS] + [{"prompt": "hello ", "completion": t} for t in TEXTS]
    path = tmp_path / "text.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    got = read_lengths(str(path), find_model(str(model_dir)))
    assert list(got.tokens) == _trl_counts(model_dir, rows) and got.tokenizer == str(model_dir)


CHAT = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}")


def test_conversations_count_through_the_chat_template(tmp_path, model_dir):
    from transformers import AutoTokenizer
    from trl.data_utils import _tokenize

    from memfit.facts.catalog import find_model

    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": CHAT}))
    user = [{"role": "user", "content": t} for t in TEXTS]
    bot = [{"role": "assistant", "content": t[::-1]} for t in TEXTS]
    rows = [{"messages": [u, a]} for u, a in zip(user, bot)] + [{"prompt": [u], "completion": [a]}
                                                                 for u, a in zip(user, bot)]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    # TRL: no EOS appended to conversations; prompt + completion rendered as one conversation
    want = [len(_tokenize(tok, r.get("messages") or r["prompt"] + r["completion"])["input_ids"]) for r in rows]
    assert list(read_lengths(str(path), find_model(str(model_dir))).tokens) == want
    assert len(set(want)) > 2


def test_raw_text_through_the_cli_and_in_parquet(tmp_path, model_dir, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "text.parquet"
    pq.write_table(pa.table({"text": TEXTS * 10, "source": ["web"] * 40}), str(path))
    assert main(["estimate", str(model_dir), *KNOBS, "--lengths", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["lengths"]
    assert doc["worst"]["seq_len"] == max(_trl_counts(model_dir, [{"text": t} for t in TEXTS]))
    assert any("tokenizer" in n for n in doc["notes"])


def test_parquet_and_saved_datasets_read_like_jsonl(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = [[1] * n for n in (5, 17, 3)]
    pq.write_table(pa.table({"input_ids": ids, "attention_mask": ids}), str(tmp_path / "a.parquet"))
    pq.write_table(pa.table({"chosen_input_ids": ids, "rejected_input_ids": ids[::-1]}), str(tmp_path / "p.bin"))
    datasets.Dataset.from_dict({"length": [5, 17, 3]}).save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"test": datasets.Dataset.from_dict({"length": [9]}),
                          "train": datasets.Dataset.from_dict({"input_ids": ids})}).save_to_disk(str(tmp_path / "dd"))
    for name in ("a.parquet", "one", "dd"):
        got = read_lengths(str(tmp_path / name))
        assert got.tokens == (5, 17, 3) and not got.pairs, name
    pairs = read_lengths(str(tmp_path / "p.bin"))  # Parquet by its magic bytes, whatever the name
    assert pairs.tokens == (5, 17, 5) and pairs.pairs


@pytest.fixture
def offline(tmp_path, monkeypatch):
    import datasets
    from huggingface_hub import constants

    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(key, "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")


def _bad(tmp_path, model_dir):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"length": [4, 0]}), str(tmp_path / "zero.parquet"))
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "folder").mkdir()
    datasets.DatasetDict({"test": datasets.Dataset.from_dict({"length": [9]})}).save_to_disk(str(tmp_path / "nt"))
    pq.write_table(pa.table({"image": ["a.png"]}), str(tmp_path / "cols.parquet"))
    (tmp_path / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    (tmp_path / "dpo.jsonl").write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n')
    (tmp_path / "text.jsonl").write_text('{"length": 3}\n{"text": "hi"}\n')
    return [
        ("zero.parquet", str(model_dir), "zero.parquet: row 2: length 0 is not a positive"),
        ("broken.parquet", str(model_dir), "broken.parquet: not a readable Parquet file"),
        ("folder", str(model_dir), "folder: a folder, but not a dataset saved with save_to_disk"),
        ("nt", str(model_dir), "without a 'train' split (it has: test)"),
        ("cols.parquet", str(model_dir), "cols.parquet: no column memfit reads (one of: length, input_ids"),
        ("chat.jsonl", str(model_dir), "chat.jsonl:1: conversations need the model's chat template, and"),
        ("dpo.jsonl", str(model_dir), "dpo.jsonl:1: preference pairs as text are not counted"),
        ("text.jsonl", "qwen2-7b-instruct", "text.jsonl:2: raw text needs the model's tokenizer"),
        ("acme/no-such-data", str(model_dir), "could not load it as a dataset name"),
        ("no/such/file.txt", str(model_dir), "no such file or folder"),
        ("nosuch/file.jsonl", str(model_dir), "no such file or folder"),
    ]


def test_bad_data_is_one_line_naming_it(tmp_path, model_dir, offline, capsys):
    cases = _bad(tmp_path, model_dir)
    capsys.readouterr()  # save_to_disk's progress bars
    for name, model, words in cases:
        data = name if name.startswith(("acme/", "nosuch/")) else str(tmp_path / name)  # bare: as typed
        assert main(["estimate", model, *KNOBS, "--lengths", data]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("memfit: error: ") and words in err and err.count("\n") == 1, (name, err)
    with pytest.raises(MemfitError, match="raw text needs the model's tokenizer"):
        read_lengths(str(tmp_path / "text.jsonl"))  # no model given at all
