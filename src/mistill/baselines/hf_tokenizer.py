"""Our tokenizers as `transformers` tokenizers, for TRL's on-policy trainers (App. J.3: OPD, GOLD).

TRL drives its trainers through a `PreTrainedTokenizerBase`: it renders the chat template, tokenizes the
prompts, decodes the sampled completions and, for GOLD's cross-tokenizer ULD, reads each token's byte span
from the fast backend.  `TRLTokenizer` answers every one of these from one of our `TextTokenizer`s, so the
ids TRL trains on are exactly ours:

* text -> ids is `encode(text).ids`; no special token is ever added (ours never adds one, and neither
  Qwen3's nor SmolLM3's chat prompt starts with a BOS);
* ids -> text is `decode(ids)`, special ids dropped only when TRL asks;
* the chat template renders one user turn as `chat_prompt(user_text)`, character for character (thinking
  on, SmolLM3's pinned date); it refuses any other conversation rather than render one ours never does;
* `backend_tokenizer` is the real byte-level BPE with its ids mapped onto ours (the demo's compact remap),
  so GOLD's byte offsets are the real tokens' spans;
* a token's string is its byte-level piece (one character per UTF-8 byte), which GOLD counts to place the
  tokens of an on-policy completion; an id outside the remap decodes to U+FFFD, and its piece is that
  character's three bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

from transformers.tokenization_python import PythonBackend

from mistill.errors import UserError
from mistill.models.tokenizers import CompactTokenizer, FastTextTokenizer, HFTextTokenizer

UNKNOWN_TEXT = "\ufffd"      # what our decode writes for an id outside the remap
_PROBE = "\x00user turn\x00"  # a user text no template rewrites


def _byte_level(text: str) -> str:
    """`text`'s bytes in the byte-level alphabet (GPT-2's bytes_to_unicode), one character per byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return "".join(table[b] for b in text.encode("utf-8"))


def byte_level_backend(tokenizer):
    """(the real `tokenizers.Tokenizer` behind `tokenizer`, its remap table or None for identity ids)."""
    if isinstance(tokenizer, CompactTokenizer):
        return byte_level_backend(tokenizer.base)[0], tokenizer.table
    if isinstance(tokenizer, FastTextTokenizer):
        return tokenizer._backend, None
    if isinstance(tokenizer, HFTextTokenizer):
        return tokenizer._tok.backend_tokenizer, None
    raise UserError(f"tokenizer {getattr(tokenizer, 'name', tokenizer)!r}: TRL needs one of ours backed by a "
                    "byte-level BPE (CompactTokenizer, FastTextTokenizer or HFTextTokenizer)")


@dataclass(frozen=True)
class _RemappedEncoding:
    ids: list[int]
    offsets: list[tuple[int, int]]
    tokens: list[str]


class RemappedBackend:
    """The real byte-level BPE with its ids mapped onto ours: what GOLD reads as `backend_tokenizer`."""

    def __init__(self, backend, table: list[int] | None, unknown_id: int):
        self._backend = backend
        self._to_ours = None if table is None else {base_id: k + 1 for k, base_id in enumerate(table)}
        self._unknown_id = unknown_id

    @property
    def pre_tokenizer(self):   # GOLD checks these for "ByteLevel" before it trusts the offsets
        return self._backend.pre_tokenizer

    @property
    def decoder(self):
        return self._backend.decoder

    def _ours(self, enc) -> _RemappedEncoding:
        ids = list(enc.ids) if self._to_ours is None else [self._to_ours.get(i, self._unknown_id) for i in enc.ids]
        return _RemappedEncoding(ids, [tuple(o) for o in enc.offsets], list(enc.tokens))

    def encode(self, text: str, add_special_tokens: bool = False) -> _RemappedEncoding:
        return self._ours(self._backend.encode(text, add_special_tokens=add_special_tokens))

    def encode_batch(self, texts: list[str], add_special_tokens: bool = False) -> list[_RemappedEncoding]:
        return [self._ours(e) for e in self._backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)]


def single_turn_template(prefix: str, suffix: str) -> str:
    """A chat template that renders one user turn as prefix + content + suffix, and refuses anything else."""
    return ("{%- if messages | length != 1 or messages[0].role != 'user' -%}"
            "{{ raise_exception('this chat template renders one user turn only (the project\\'s chat_prompt)') }}"
            "{%- endif -%}"
            "{%- if not add_generation_prompt -%}"
            "{{ raise_exception('this chat template renders the generation prompt only') }}"
            "{%- endif -%}"
            f"{{{{ {json.dumps(prefix)} }}}}{{{{ messages[0].content }}}}{{{{ {json.dumps(suffix)} }}}}")


class TRLTokenizer(PythonBackend):
    """One of our `TextTokenizer`s behind transformers' tokenizer interface (see the module docstring)."""

    model_input_names = ["input_ids", "attention_mask"]
    vocab_files_names: dict[str, str] = {}

    def __init__(self, tokenizer, **kwargs):
        # set before the base constructor: it reads the vocabulary to register the special tokens
        self.text_tokenizer = tokenizer
        backend, table = byte_level_backend(tokenizer)
        self._pieces_backend = backend
        self._table = table
        self._size = int(tokenizer.vocab_size)
        self._unknown_id = getattr(tokenizer, "unk_token_id", None)
        prefix, suffix = self._chat_parts(tokenizer)
        super().__init__(eos_token=self._convert_id_to_token(tokenizer.eos_token_id),
                         pad_token=self._convert_id_to_token(tokenizer.pad_token_id),
                         chat_template=single_turn_template(prefix, suffix), padding_side="left",
                         truncation_side="left", model_max_length=int(1e30), clean_up_tokenization_spaces=False,
                         special_tokens_pattern="none", **kwargs)
        rendered = self.apply_chat_template([{"role": "user", "content": "probe"}], tokenize=False,
                                            add_generation_prompt=True)
        if rendered != tokenizer.chat_prompt("probe"):
            raise UserError(f"tokenizer {tokenizer.name}: the chat template does not reproduce chat_prompt "
                            "(a character its JSON escape cannot carry?)")

    @staticmethod
    def _chat_parts(tokenizer) -> tuple[str, str]:
        rendered = tokenizer.chat_prompt(_PROBE)
        if rendered.count(_PROBE) != 1:
            raise UserError(f"tokenizer {tokenizer.name}: chat_prompt does not carry the user text verbatim")
        prefix, suffix = rendered.split(_PROBE)
        if tokenizer.chat_prompt("x y") != prefix + "x y" + suffix:
            raise UserError(f"tokenizer {tokenizer.name}: chat_prompt depends on the user text beyond inserting it")
        return prefix, suffix

    # -- vocabulary ----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._size

    def __len__(self) -> int:
        return self._size

    def _base_id(self, index: int) -> int | None:
        if self._table is None:
            return index if 0 <= index < self._size else None
        return self._table[index - 1] if 0 < index <= len(self._table) else None

    def _convert_id_to_token(self, index: int) -> str:
        base_id = self._base_id(int(index))
        piece = None if base_id is None else self._pieces_backend.id_to_token(base_id)
        return _byte_level(UNKNOWN_TEXT) if piece is None else piece

    def _convert_token_to_id(self, token: str) -> int | None:
        base_id = self._pieces_backend.token_to_id(token)
        if base_id is None:
            return self._unknown_id
        return self.text_tokenizer.to_compact([base_id])[0] if self._table is not None else base_id

    @cached_property
    def _vocab(self) -> dict[str, int]:
        vocab = {}
        for index in range(self._size):
            if self._base_id(index) is not None:   # the unknown id has no piece of its own
                vocab.setdefault(self._convert_id_to_token(index), index)
        return vocab

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    @property
    def backend_tokenizer(self) -> RemappedBackend:
        return RemappedBackend(self._pieces_backend, self._table, self._unknown_id)

    # -- text <-> ids --------------------------------------------------------------------------
    def tokenize(self, text: str, **kwargs) -> list[str]:
        return [self._convert_id_to_token(i) for i in self.text_tokenizer.encode(text).ids]

    def _encode_plus(self, text, text_pair=None, **kwargs):
        # every string becomes our ids before transformers sees it: its own splitting never runs
        def ours(value):
            if isinstance(value, str):
                ids = self.text_tokenizer.encode(value).ids
                if not ids:
                    raise UserError("TRL asked to tokenize an empty text")
                return ids
            if isinstance(value, list | tuple) and value and isinstance(value[0], str):
                return [ours(v) for v in value]
            return value
        if kwargs.get("is_split_into_words"):
            raise UserError("pre-split words are not ours to tokenize: pass whole texts")
        kwargs.pop("sanitize_control_tokens", None)
        return super()._encode_plus(ours(text), None if text_pair is None else ours(text_pair), **kwargs)

    def _decode(self, token_ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces=None,
                **kwargs) -> str:
        ids = [int(token_ids)] if isinstance(token_ids, int) else [int(i) for i in token_ids]
        if skip_special_tokens:
            special = set(self.all_special_ids)
            ids = [i for i in ids if i not in special]
        return self.text_tokenizer.decode(ids)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self._decode(self.convert_tokens_to_ids(tokens))

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        # TRL saves the processing class into its checkpoints; ours is rebuilt from the model's own
        # tokenizer files (`tokenizer_remap.json` or the HF files), so there is no vocabulary to write
        return ()
