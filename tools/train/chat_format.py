"""The chat format of the built-in model: its special tokens and its template, on the Python side.

`chat_template.jinja` is the one template text: training renders it here with jinja2, the
archive stores it as `cqlm.chat_template`, and `cqlm serve` renders it with minijinja (both
with `trim_blocks` and `lstrip_blocks`, as Hugging Face does). A Rust test checks that both
sides turn the same conversations into the same token ids (`tests/fixtures/chat/`).

A conversation renders as

    <bos><|system|>tools: get_weather convert_units calculate lookup_verse<|end|>
    <|user|>What's the weather in Paris?<|end|>
    <|assistant|><tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call><|end|>
    <|tool|>{"city":"Paris","temperature":18,"unit":"celsius","condition":"cloudy"}<|end|>
    <|assistant|>It is 18 degrees celsius and cloudy in Paris.<|end|>

without the line breaks. Only the tools' names are listed: the model's attention window is 256
tokens, and the four tools' schemas alone would fill it. `<|end|>` ends a turn and is the
archive's EOS, so generation stops there.
"""

from __future__ import annotations

import json
import os

import jinja2

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_PATH = os.path.join(HERE, "chat_template.jinja")

# Role and end-of-turn tokens (special: no text produces them, a grammar cannot emit them),
# and the two tool-call markers (ordinary tokens: they are text the tool-call grammar writes).
SPECIAL = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]
MARKERS = ["<tool_call>", "</tool_call>"]
END = "<|end|>"
ASSISTANT = "<|assistant|>"


def extend_tokenizer(tokenizer_json: str):
    """The base tokenizer (a `tokenizers.Tokenizer`) with the chat tokens appended (ids vocab,
    vocab+1, ...)."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    base = tok.get_vocab_size(with_added_tokens=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKERS])
    for i, t in enumerate(SPECIAL + MARKERS):
        if tok.token_to_id(t) != base + i:
            raise SystemExit(f"{t} got id {tok.token_to_id(t)}, expected {base + i}")
    return tok


# A space before a capital letter or a digit is a token of its own, so a name or a number is
# the same tokens after a space (in a request, an answer) as after a JSON quote (in a call, a
# tool result): ` Ashgabat` and `"Ashgabat"` share `As h g ab at`. Byte-level BPE would
# otherwise write ` Ashgabat` as `ĠAs h g ab at`, and a call could not be made by repeating the
# request's tokens (the model had to spell names anew and copied 8% of cities). The
# vocabulary and its ids stay as they are; text has 7.8% more tokens (`heldout.txt`).
NAME_SPLIT = r" (?=[\p{Lu}\p{N}])"


def split_names(tok):
    """`tok` (a `tokenizers.Tokenizer` with the ByteLevel pre-tokenizer) with the space before a
    capital or a digit split off first (`NAME_SPLIT`); unchanged if it already does."""
    from tokenizers import Regex, pre_tokenizers

    pre = json.loads(tok.to_str()).get("pre_tokenizer") or {}
    if any(p.get("type") == "Split" and p.get("pattern") == {"Regex": NAME_SPLIT}
           for p in pre.get("pretokenizers", [])):
        return tok
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(NAME_SPLIT), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    return tok


def template_text() -> str:
    with open(TEMPLATE_PATH, encoding="utf-8") as f:
        return f.read()


_ENV = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
_TEMPLATE = None


def render(messages: list[dict], tools: list | None, add_generation_prompt: bool,
           bos: str = "<bos>", eos: str = END) -> str:
    """The prompt text, as `cqlm serve` renders it (tools: full OpenAI definitions or None)."""
    global _TEMPLATE
    if _TEMPLATE is None:
        _TEMPLATE = _ENV.from_string(template_text())
    t = _TEMPLATE
    norm = [{"role": m["role"], "content": m.get("content") or "", "tool_calls": m.get("tool_calls") or [],
             "tool_call_id": m.get("tool_call_id"), "name": m.get("name")} for m in messages]
    return t.render(messages=norm, tools=tools, add_generation_prompt=add_generation_prompt,
                    bos_token=bos, eos_token=eos)


def tool_defs(names: list[str] | None, all_tools: list) -> list | None:
    """The definitions of the named tools, in that order."""
    if names is None:
        return None
    by = {t["function"]["name"]: t for t in all_tools}
    return [by[n] for n in names]


def load_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
