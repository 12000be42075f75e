"""Tiny configurations of the paper's real architectures, for the demo.

The teacher and the same-family student are transformers' `Qwen3ForCausalLM`
(GQA, per-head q/k RMSNorm, RoPE); the cross-family student is
`SmolLM3ForCausalLM`, which keeps SmolLM3's NoPE pattern (every
`no_rope_layer_interval`-th layer has no rotary embedding; App. J.1).  The second
teacher (R-C15, App. H: QwQ-32B) is `Qwen2ForCausalLM`: biased q/k/v projections
and no q/k RMSNorm, with Qwen2.5's tokenizer, whose ordinary tokens are Qwen3's.
Only the sizes are scaled down; the modules (and so the `o_proj` input the
instrument hooks, and the eager attention probabilities it reads) are the real ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mistill.errors import UserError
from mistill.models.tokenizers import QWEN3_FAMILY, SMOLLM3_FAMILY

QWEN2_FAMILY = "qwen2"
# architecture family -> tokenizer family: QwQ-32B tokenizes with Qwen2.5's BPE, the one Qwen3 kept
TOKENIZER_FAMILY = {QWEN3_FAMILY: QWEN3_FAMILY, SMOLLM3_FAMILY: SMOLLM3_FAMILY, QWEN2_FAMILY: QWEN3_FAMILY}

# Eager attention returns the attention probabilities the read side needs
# (App. E); sdpa computes the same function and may be used where they are not read.
DEFAULT_ATTN = "eager"


@dataclass(frozen=True)
class TinyArchitecture:
    """Sizes of one tiny model; `family` picks Qwen3, SmolLM3 or Qwen2 (and so the tokenizer)."""

    family: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 16384
    rope_theta: float = 1_000_000.0
    no_rope_layer_interval: int = 4  # SmolLM3 only
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_params(cls, section: dict[str, Any]) -> TinyArchitecture:
        known = set(cls.__dataclass_fields__)
        unknown = set(section) - known
        if unknown:
            raise UserError(f"unknown architecture keys: {', '.join(sorted(unknown))}")
        if section.get("family") not in TOKENIZER_FAMILY:
            raise UserError(f"architecture family must be one of {', '.join(TOKENIZER_FAMILY)}, "
                            f"got {section.get('family')!r}")
        arch = cls(**section)
        if arch.num_attention_heads % arch.num_key_value_heads:
            raise UserError("num_attention_heads must be a multiple of num_key_value_heads (GQA groups)")
        return arch

    @property
    def tokenizer_family(self) -> str:
        return TOKENIZER_FAMILY[self.family]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_config(arch: TinyArchitecture, *, vocab_size: int, eos_token_id: int, pad_token_id: int,
                 attn_implementation: str = DEFAULT_ATTN):
    """The transformers config of `arch` over a (compact) vocabulary."""
    common = dict(
        vocab_size=vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        max_position_embeddings=arch.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": arch.rope_theta},
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        **arch.extra,
    )
    if arch.family == QWEN3_FAMILY:
        from transformers import Qwen3Config

        config = Qwen3Config(head_dim=arch.head_dim, **common)
    elif arch.family == QWEN2_FAMILY:
        from transformers import Qwen2Config

        if arch.head_dim * arch.num_attention_heads != arch.hidden_size:
            raise UserError("Qwen2 derives head_dim = hidden_size / num_attention_heads; set head_dim accordingly")
        config = Qwen2Config(**common)
    elif arch.family == SMOLLM3_FAMILY:
        from transformers import SmolLM3Config

        if arch.head_dim * arch.num_attention_heads != arch.hidden_size:
            raise UserError("SmolLM3 derives head_dim = hidden_size / num_attention_heads; set head_dim accordingly")
        config = SmolLM3Config(no_rope_layer_interval=arch.no_rope_layer_interval, **common)
    else:  # pragma: no cover - from_params validates
        raise UserError(f"unknown family {arch.family!r}")
    config._attn_implementation = attn_implementation
    return config


def build_model(arch: TinyArchitecture, *, vocab_size: int, eos_token_id: int, pad_token_id: int, seed: int,
                attn_implementation: str = DEFAULT_ATTN):
    """A randomly initialised tiny model, deterministic given `seed`."""
    import torch
    from transformers import Qwen2ForCausalLM, Qwen3ForCausalLM, SmolLM3ForCausalLM

    config = build_config(arch, vocab_size=vocab_size, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                          attn_implementation=attn_implementation)
    torch.manual_seed(seed)
    cls = {QWEN3_FAMILY: Qwen3ForCausalLM, SMOLLM3_FAMILY: SmolLM3ForCausalLM, QWEN2_FAMILY: Qwen2ForCausalLM}[arch.family]
    model = cls(config)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = pad_token_id
    model.generation_config.bos_token_id = None
    return model.eval()
