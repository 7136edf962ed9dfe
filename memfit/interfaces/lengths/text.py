"""Raw-text rows of --lengths DATA counted with the model's tokenizer, the way TRL's SFTTrainer counts them
(trl 1.16.0, trainer/sft_trainer.py and data_utils._tokenize):
- text: the EOS token is appended to `text` (or to `completion`) unless it already ends with it, then the text is
  tokenized whole, the tokenizer's post-processor adding its special tokens (a BOS, say); a prompt + completion
  row is tokenized as one string, prompt + completion. The tokenizer is the model's tokenizer.json, read by the
  `tokenizers` library (memfit[data], imported here only).
- conversations (`messages`, or prompt / completion as message lists): no EOS appended; the model's chat template
  (a jinja program) renders prompt + completion and tokenizes it, run by transformers' own apply_chat_template on
  the tokenizer loaded from the same folder. A row's `tools` / `chat_template_kwargs` columns are not passed on.
The folder is the model's (a local config.json's), or for a hub id the HF cache's snapshot, filled through
memfit/facts/hub.py (HF_HUB_OFFLINE honoured). A catalog name carries no tokenizer and never reaches the hub."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from memfit.errors import MemfitError
from memfit.facts import hub

# the release whose SFT tokenization these counts follow (read in its trainer/sft_trainer.py and data_utils._tokenize);
# tests/lengths/test_inputs.py checks it is memfit's pinned trl and counts against the installed one
COUNTED_AS = ("trl", "1.16.0")
INSTALL = "install memfit[data] (pyarrow, datasets, tokenizers)"


@dataclass
class TextCounter:
    encode: Callable[[str], int]  # tokens of one string, special tokens included
    eos: str | None  # the EOS token's text, appended as TRL appends it
    source: str  # where the tokenizer came from, for the notes
    folder: Path | None = None  # holds tokenizer_config.json (the chat template), for conversations
    chat: Callable[[list], int] | None = None  # built on the first conversational row

    def count(self, where: str, row: dict) -> int:
        prompt, completion, text = row.get("prompt"), row.get("completion"), row.get("text")
        if "messages" in row or isinstance(prompt, list) or isinstance(completion, list):
            return self._conversation(where, row.get("messages"), prompt, completion)
        if prompt is not None or completion is not None:
            if not isinstance(prompt, str) or not isinstance(completion, str):
                raise MemfitError(f"{where}: a prompt / completion row needs both as text")
            return self.encode(prompt + self._eos(completion))
        if not isinstance(text, str):
            raise MemfitError(f"{where}: text {text!r:.40} is not a string")
        return self.encode(self._eos(text))

    def _eos(self, text: str) -> str:
        return text if not self.eos or text.endswith(self.eos) else text + self.eos

    def _conversation(self, where: str, messages, prompt, completion) -> int:
        if messages is None:
            if not isinstance(prompt, list) or not isinstance(completion, list):
                raise MemfitError(f"{where}: a conversational prompt / completion row needs both as message lists")
            messages = prompt + completion
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise MemfitError(f"{where}: messages must be a list of {{role, content}} objects")
        if self.chat is None:
            self.chat = _chat(self.folder, where)
        try:
            return self.chat(messages)
        except Exception as e:  # noqa: BLE001 - a template's own errors (a role it refuses, say): one line
            raise MemfitError(f"{where}: the chat template refused the row ({_first_line(e)})") from None


def text_counter(model) -> TextCounter:
    """The model's tokenizer: tokenizer.json beside its config.json (a local folder, or the HF cache's snapshot of
    a hub id), else the hub's at that snapshot. A catalog name carries no tokenizer and never reaches the hub."""
    folder = Path(model.config_file).parent if model.config_file else None
    if folder is not None and (folder / "tokenizer.json").is_file():
        return _load(folder / "tokenizer.json", str(folder))
    if folder is None or not model.config_source.startswith("hub "):
        raise MemfitError(f"raw text needs the model's tokenizer, and {folder or model.id} has no tokenizer.json; "
                          "give the model as a folder holding one (or as a hub id), or write token counts instead")
    repo = hub.split_id(model.id)[0]
    try:  # the snapshot's folder is named by its commit: the tokenizer of the very revision the config came from
        path = hub.repo_file(repo, "tokenizer.json", folder.name, "give the model as a folder holding tokenizer.json")
    except hub.HubError as e:
        raise MemfitError(f"raw text needs the model's tokenizer: {e}") from None
    for extra in ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):  # optional
        try:
            hub.repo_file(repo, extra, folder.name, "")
        except hub.HubError:
            pass
    return _load(path, f"hub {repo}@{folder.name}")


def _load(path: Path, source: str) -> TextCounter:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise MemfitError(f"raw text needs the tokenizers library to count tokens; {INSTALL}") from None
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - the library's parse errors: one line naming the file
        raise MemfitError(f"{path}: not a tokenizer.json the tokenizers library reads ({str(e)[:120]})") from None
    return TextCounter(lambda s: len(tok.encode(s).ids), _eos_token(path.parent), source, path.parent)


def _chat(folder: Path | None, where: str) -> Callable[[list], int]:
    """The model's chat template as TRL runs it (apply_chat_template, tokenize=True), from the folder only."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise MemfitError(f"{where}: conversations run the model's chat template, which needs transformers "
                          "(and jinja2) installed") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # noqa: BLE001 - a folder transformers cannot read: one line naming it
        raise MemfitError(f"{where}: transformers cannot load the tokenizer in {folder} ({_first_line(e)})") from None
    if not getattr(tok, "chat_template", None):
        raise MemfitError(f"{where}: conversations need the model's chat template, and {folder} has none (no "
                          "chat_template in tokenizer_config.json or chat_template.jinja)")

    def count(messages) -> int:  # return_dict=True gives a mapping; transformers annotates every form it returns
        return len(tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])  # type: ignore[call-overload, index]

    return count


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:160]


def _eos_token(folder: Path) -> str | None:
    """The EOS token's text as transformers reads it: tokenizer_config.json, else special_tokens_map.json."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            eos = json.loads((folder / name).read_text()).get("eos_token")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str) and eos:
            return eos
    return None
