"""What both generation backends share: the sampling settings, a sampled completion and the stop rule.

`Decoding` holds App. B / J.1's sampling settings (temperature 0.6, top-p 0.95, top-k 20, never greedy) and the
cap on new tokens; `Generation` is one sampled completion; `completion_of` turns a row of new token ids into
one, closed by the model's end-of-turn token or capped. `mistill.models.generation` (transformers) and
`mistill.models.vllm_backend` (vLLM) both end in `completion_of`, so a trace means the same whichever wrote it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mistill.errors import UserError


@dataclass(frozen=True)
class Generation:
    prompt: str            # untemplated user text
    completion: str        # text after the assistant header, without the end-of-turn token
    n_new_tokens: int      # tokens generated, end-of-turn token included when emitted
    hit_cap: bool          # stopped by max_new_tokens, not by end of turn
    seed: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Decoding:
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    max_new_tokens: int = 1024

    @classmethod
    def from_params(cls, section: dict[str, Any]) -> Decoding:
        known = {k: section[k] for k in cls.__dataclass_fields__ if k in section}
        decoding = cls(**known)
        if decoding.temperature <= 0:
            raise UserError("decoding.temperature must be positive: greedy decoding loops in thinking mode (App. J.1)")
        if not 0 < decoding.top_p <= 1 or decoding.top_k < 1 or decoding.max_new_tokens < 1:
            raise UserError(f"decoding: invalid settings {decoding}")
        return decoding

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def completion_of(prompt: str, new_ids: Sequence[int], tokenizer, seed: int) -> Generation:
    """The stop rule, shared by both backends: a generation is closed by the model's end-of-turn token,
    which is counted but not decoded; one that ends without it ran into the cap."""
    new_ids = list(new_ids)
    closed = bool(new_ids) and new_ids[-1] == tokenizer.eos_token_id
    text_ids = new_ids[:-1] if closed else new_ids
    return Generation(prompt, tokenizer.decode(text_ids), len(new_ids), not closed, int(seed))
