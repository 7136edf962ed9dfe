"""The OpenAPI description of `memfit serve`'s request bodies, from the knob table (every knob, its type, its
choices and help), so /openapi.json documents what the API takes without a second list of names."""
from __future__ import annotations

from memfit.facts.knobs import Knob, hardware, inputs, knobs
from memfit.interfaces.serve.requests import EXTRA_KEYS, REFUSED

JSON_TYPES: dict[str, dict] = {"int": {"type": "integer"}, "float": {"type": "number"}, "bool": {"type": "boolean"},
              "str": {"type": "string"}, "size": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
              "list": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]},
              "pairs": {"anyOf": [{"type": "object", "additionalProperties": {"type": "integer"}}, {"type": "string"}]}}
EXTRA: dict[str, dict] = {
    "model": {"anyOf": [{"type": "string"}, {"type": "object"}],
              "description": "hub id or alias (see `memfit models`), or a config.json's content as an object"},
    "model_name": {"type": "string", "description": "display name of an uploaded config.json"},
    "unread": {"type": "array", "items": {"type": "string"}, "maxItems": 32,
               "description": "an imported file's settings memfit could not read (/api/import's unread): the verdict "
                              "is then at most tight"},
    "allow": {"type": "array", "items": {"type": "string", "enum": ["lora", "qlora", "8bit"]},
              "description": "plan: changes to the training method you accept"},
    "global_batch": {"type": "integer", "description": "plan: micro-batch x grad accumulation x GPUs to keep"},
    "top": {"type": "integer", "description": "plan: rows to return (default 5, at most 20)"},
    "no_code_edits": {"type": "boolean", "description": "plan: leave out knobs the framework has no flag for"},
    "no_resume": {"type": "boolean", "description": "plan: judge host RAM without the resume phase"},
    "format": {"type": "string", "enum": ["deepspeed", "llamafactory", "openrlhf", "accelerate", "hf"],
               "description": "export: the file format (default deepspeed)"},
}


def _property(k: Knob) -> dict:
    out = dict(JSON_TYPES.get(k.type, {"type": "string"}))
    if k.choices:
        out["enum"] = list(k.choices)
    if k.default is not None and not isinstance(k.default, tuple):
        out["default"] = k.default
    return out | {"description": k.help + (f" (also: {', '.join(a.lstrip('-') for a in k.aliases)})" if k.aliases else "")}


def scenario_schema(endpoint: str) -> dict:
    props = {name: _property(k) for name, k in {**inputs(), **hardware(), **knobs()}.items() if name not in REFUSED}
    props |= {"model": EXTRA["model"], "model_name": EXTRA["model_name"], "unread": EXTRA["unread"]}
    props |= {key: EXTRA[key] for key in EXTRA_KEYS[endpoint]}
    return {"type": "object", "required": ["model"], "properties": props, "additionalProperties": False}


IMPORT = {"type": "object", "required": ["text"], "properties": {
    "name": {"type": "string", "description": "the file's name (shown, and its extension tells the format)"},
    "text": {"type": "string", "description": "the file's content"}}}


def request_body(endpoint: str) -> dict:
    schema = IMPORT if endpoint == "import" else scenario_schema(endpoint)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
