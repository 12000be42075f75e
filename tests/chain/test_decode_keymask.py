"""The decode-time key mask (App. N.4, R-D34): a clean prefill, then the heads' reads of chosen prompt keys cut
at every decoding step; against a slow full forward, the plain sampler and batch composition."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from mistill.instrument.keymask import KeyBlock, decode_key_mask
from mistill.models.decoding import Decoding
from mistill.models.sampling import sample_rows
from tests.chain.test_generate import model_and_tokenizer  # noqa: F401  (the fixture)
from tests.instrument.conftest import random_ids, tiny_qwen3
from tests.instrument.test_keymask import _slow_logits

HEADS = ((0, 1), (1, 2))


@torch.no_grad()
def test_a_decoding_step_equals_the_slow_forward_with_its_row_cut():
    model = tiny_qwen3(211, attn="sdpa", seed=5)
    ids = random_ids(4, n=30)
    prompt, token = ids[:-1], ids[-1]
    keys = (2, 3, 11, 20)
    cache = DynamicCache()
    model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)   # the clean prefill
    with decode_key_mask(model, HEADS, [keys])([0], [0], len(ids)):
        out = model(input_ids=torch.tensor([[token]]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                    position_ids=torch.tensor([[len(prompt)]]), past_key_values=cache, use_cache=True)
    slow = _slow_logits(model, ids, len(prompt), KeyBlock(HEADS, keys))
    assert torch.allclose(out.logits[0, -1].float(), slow, atol=1e-4)
    plain = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    assert (plain - slow).abs().max() > 1e-3      # the cut changes the step: the test can fail


def _decoding():
    return Decoding(temperature=1.0, top_k=50, top_p=1.0, max_new_tokens=12)


def test_no_keys_is_the_plain_sampler(model_and_tokenizer):  # noqa: F811
    model, tok = model_and_tokenizer
    prompts, seeds = ["code N18.3 chronic", "kidney disease"], [3, 4]
    plain = sample_rows(model, tok, prompts, seeds, _decoding())
    masked = sample_rows(model, tok, prompts, seeds, _decoding(), decode_context=decode_key_mask(model, HEADS, [(), ()]))
    assert masked == plain


def test_each_row_keeps_its_own_keys_under_left_padding(model_and_tokenizer):  # noqa: F811
    model, tok = model_and_tokenizer
    prompts, seeds = ["code chronic kidney disease N18.3 disease", "N18.3"], [5, 6]
    keys = [(1, 2, 3, 4, 5), ()]
    together = sample_rows(model, tok, prompts, seeds, _decoding(), decode_context=decode_key_mask(model, HEADS, keys))
    alone = [sample_rows(model, tok, [p], [s], _decoding(), decode_context=decode_key_mask(model, HEADS, [k]))[0]
             for p, s, k in zip(prompts, seeds, keys)]
    assert together == alone


def test_keys_outside_the_prompt_and_unknown_heads_are_refused(model_and_tokenizer):  # noqa: F811
    model, tok = model_and_tokenizer
    with pytest.raises(ValueError, match="outside"):
        decode_key_mask(model, ((99, 0),), [()])
    with pytest.raises(ValueError, match="reach outside"):
        sample_rows(model, tok, ["N18.3"], [1], _decoding(), decode_context=decode_key_mask(model, HEADS, [(10_000,)]))
