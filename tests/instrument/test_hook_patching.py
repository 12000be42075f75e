"""The hook and the fast patch paths against the slow, obvious forward (App. C "The hook")."""

from __future__ import annotations

import pytest
import torch

from mistill.instrument.hook import HeadHook, Replacement, knock_in, mean_ablation, zeroing
from mistill.instrument.margin import margin
from mistill.instrument.patching import (
    brute_force_logits,
    forward_variants,
    forward_variants_chunked,
    one_head_per_variant,
    prefill,
)
from tests.instrument.conftest import random_ids

SEQ = 48


def _ids(seed=0, n=SEQ, vocab=211):
    return random_ids(seed, n, vocab)


def test_no_intervention_is_identical_to_plain_forward(small_model):
    ids = torch.tensor([_ids()])
    with torch.no_grad():
        plain = small_model(ids).logits
        hook = HeadHook(small_model)
        try:
            hooked = small_model(ids).logits
            empty = Replacement(torch.zeros(hook.n_layers, SEQ, hook.n_heads, dtype=torch.bool),
                                torch.randn(hook.n_layers, hook.n_heads, hook.head_dim))
            with hook.replacing(empty):
                hooked_empty = small_model(ids).logits
        finally:
            hook.remove()
    assert torch.equal(plain, hooked)
    assert torch.equal(plain, hooked_empty)


def test_zeroing_all_heads_of_a_layer_equals_zeroing_the_attention_output(small_model):
    ids = torch.tensor([_ids(1)])
    layer = 1
    attn = small_model.model.layers[layer].self_attn

    def zero_output(module, args, output):
        return (torch.zeros_like(output[0]), *output[1:])

    with torch.no_grad():
        handle = attn.register_forward_hook(zero_output)
        try:
            reference = small_model(ids).logits
        finally:
            handle.remove()
        hook = HeadHook(small_model)
        try:
            mask = torch.zeros(hook.n_layers, SEQ, hook.n_heads, dtype=torch.bool)
            mask[layer] = True
            with hook.replacing(zeroing(mask, hook.n_heads, hook.head_dim)):
                zeroed = small_model(ids).logits
            plain = small_model(ids).logits
        finally:
            hook.remove()
    assert (zeroed - reference).abs().max() < 1e-6
    assert (plain - reference).abs().max() > 1e-2  # the layer matters, so the test can fail


def test_mean_is_the_average_head_output_over_the_prefill(small_model):
    ids = _ids(2)
    hook = HeadHook(small_model)
    try:
        pre = prefill(small_model, hook, ids)
        with torch.no_grad(), hook.recording() as rec:
            small_model(torch.tensor([ids]))
    finally:
        hook.remove()
    expected = torch.stack([r[0].mean(0) for r in rec])
    assert torch.allclose(pre.mu, expected, atol=1e-6)


def test_cached_and_batched_patches_equal_brute_force_for_every_head(small_model):
    """Every head mean-ablated at sampled positions: batched+cached == full forward, to 1e-5."""
    ids = _ids(3)
    target, competitors = 5, [7, 11, 13]
    hook = HeadHook(small_model)
    try:
        pre = prefill(small_model, hook, ids, logit_positions=list(range(SEQ)))
        heads = [(l, h) for l in range(hook.n_layers) for h in range(hook.n_heads)]
        for q in (40, 23, 9):  # decreasing: the cache is only cropped
            mask = one_head_per_variant(hook.n_layers, hook.n_heads, heads)
            batched = forward_variants_chunked(small_model, hook, pre.cache, q, ids[q], mask, pre.mu,
                                               max_batch=5)
            single = forward_variants(small_model, hook, pre.cache, q, ids[q], None, 1)[0]
            assert torch.allclose(single, pre.logits[q], atol=1e-5)
            assert torch.allclose(batched[0], pre.logits[q], atol=1e-5)
            effects = []
            for b, (l, h) in enumerate(heads, start=1):
                head_mask = torch.zeros(hook.n_layers, hook.n_heads, dtype=torch.bool)
                head_mask[l, h] = True
                brute = brute_force_logits(small_model, hook, ids[:q], ids[q], head_mask, pre.mu)
                assert (batched[b] - brute).abs().max() < 1e-5, (q, l, h)
                effects.append(float(margin(brute, target, competitors) - margin(batched[0], target, competitors)))
            assert max(abs(e) for e in effects) > 1e-2  # the heads matter at these events
    finally:
        hook.remove()


def test_knocking_in_all_heads_reproduces_the_clean_margin(small_model):
    clean, donor = _ids(4), _ids(5)
    target, competitors = 17, [19, 23]
    hook = HeadHook(small_model)
    try:
        pre_c = prefill(small_model, hook, clean, logit_positions=list(range(SEQ)))
        pre_d = prefill(small_model, hook, donor)
        gaps = []
        for q_c, q_d in ((45, 41), (30, 33), (12, 20)):
            with hook.recording() as rec:
                forward_variants(small_model, hook, pre_c.cache, q_c, clean[q_c], None, 1)
            recorded = torch.stack([r[0, 0] for r in rec])  # [L, H, D] at q_c
            everything = torch.ones(hook.n_layers, 2, hook.n_heads, dtype=torch.bool)
            everything[:, 0] = False  # variant 0: the corrupted run, nothing knocked in
            out = forward_variants(small_model, hook, pre_d.cache, q_d, clean[q_c],
                                   knock_in(everything, recorded), 2)
            m_clean = margin(pre_c.logits[q_c], target, competitors)
            m_corr, m_all = margin(out, target, competitors)
            assert abs(float(m_all - m_clean)) < 1e-4
            gaps.append(abs(float(m_corr - m_clean)))
            # the brute-force knock-in at the donor's position agrees
            brute = brute_force_logits(small_model, hook, donor[:q_d], clean[q_c],
                                       torch.ones(hook.n_layers, hook.n_heads, dtype=torch.bool), recorded)
            assert torch.allclose(brute, out[1], atol=1e-5)
        assert max(gaps) > 1e-2  # the donor context does change the margin
    finally:
        hook.remove()


def test_batched_knock_in_of_head_subsets_equals_brute_force(small_model):
    clean, donor = _ids(6), _ids(7)
    hook = HeadHook(small_model)
    try:
        pre_c = prefill(small_model, hook, clean)
        pre_d = prefill(small_model, hook, donor)
        q_c, q_d = 30, 25
        with hook.recording() as rec:
            forward_variants(small_model, hook, pre_c.cache, q_c, clean[q_c], None, 1)
        recorded = torch.stack([r[0, 0] for r in rec])
        g = torch.Generator().manual_seed(0)
        sets = torch.rand(hook.n_layers, 6, hook.n_heads, generator=g) < 0.4
        out = forward_variants(small_model, hook, pre_d.cache, q_d, clean[q_c], knock_in(sets, recorded), 6)
        for b in range(6):
            brute = brute_force_logits(small_model, hook, donor[:q_d], clean[q_c], sets[:, b], recorded)
            assert (out[b] - brute).abs().max() < 1e-5
    finally:
        hook.remove()


def test_gradient_enabled_forward_reproduces_the_plain_margin(small_model):
    ids = _ids(8)
    hook = HeadHook(small_model)
    try:
        pre = prefill(small_model, hook, ids, logit_positions=list(range(SEQ)))
        for mode in ("intact", "detached"):
            from mistill.instrument.patching import crop_to
            crop_to(pre.cache, 30)
            with torch.enable_grad(), hook.gradient_leaves(mode):
                out = small_model(input_ids=torch.tensor([[ids[30]]]), past_key_values=pre.cache, use_cache=True)
            crop_to(pre.cache, 30)
            assert torch.allclose(out.logits[0, -1].float(), pre.logits[30], atol=1e-5)
        mean = mean_ablation(torch.zeros(hook.n_layers, 1, hook.n_heads, dtype=torch.bool), pre.mu)
        again = forward_variants(small_model, hook, pre.cache, 30, ids[30], mean, 1)[0]
        assert torch.allclose(again, pre.logits[30], atol=1e-5)
    finally:
        hook.remove()


def test_split_variant_attention_equals_masked_attention(small_model):
    """The cache-once attention merged by log-sum-exp == the 4D-masked attention, every head ablated."""
    ids = _ids(9)
    hook = HeadHook(small_model)
    try:
        pre = prefill(small_model, hook, ids)
        heads = [(l, h) for l in range(hook.n_layers) for h in range(hook.n_heads)]
        mask = one_head_per_variant(hook.n_layers, hook.n_heads, heads)
        for q in (44, 17):
            split = forward_variants(small_model, hook, pre.cache, q, ids[q], mean_ablation(mask, pre.mu),
                                     mask.shape[1], split_attention=True)
            masked = forward_variants(small_model, hook, pre.cache, q, ids[q], mean_ablation(mask, pre.mu),
                                      mask.shape[1], split_attention=False)
            assert (split - masked).abs().max() < 1e-5
            assert (split[1:] - split[:1]).abs().max() > 1e-3  # the variants differ
    finally:
        hook.remove()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_split_attention_on_cuda_bf16_matches_the_fp32_masked_path():
    """The flash-attention path (bf16, CUDA) against the masked path of the same model in float32."""
    from tests.instrument.conftest import tiny_qwen3

    model32 = tiny_qwen3(211, layers=3, heads=8, kv_heads=2, head_dim=64).cuda()
    from mistill.models.loading import cast_weights

    model16 = cast_weights(tiny_qwen3(211, layers=3, heads=8, kv_heads=2, head_dim=64).cuda(), torch.bfloat16)
    ids = _ids(10, n=300)
    results = []
    for model, split in ((model32, False), (model16, True)):
        hook = HeadHook(model)
        pre = prefill(model, hook, ids)
        heads = [(l, h) for l in range(hook.n_layers) for h in range(hook.n_heads)]
        mask = one_head_per_variant(hook.n_layers, hook.n_heads, heads).cuda()
        results.append(forward_variants(model, hook, pre.cache, 250, ids[250], mean_ablation(mask, pre.mu),
                                        mask.shape[1], split_attention=split).float().cpu())
        hook.remove()
    m32, m16 = (margin(r, 5, [7, 11, 13]) for r in results)
    assert (m32 - m16).abs().max() < 0.1  # bf16 rounding only


def test_variants_of_different_events_in_one_forward_equal_brute_force(small_model):
    """Variants at several positions, mixed in forwards of 4 (each sees the cache up to its own
    position): every one equals the full forward of its prefix, heads replaced or not."""
    from mistill.instrument.patching import Variants, run_variants

    ids = _ids(6)
    hook = HeadHook(small_model)
    try:
        pre = prefill(small_model, hook, ids)
        positions = [44, 10, 31, 44, 23, 5, 31, 38, 17]
        mask = torch.zeros(hook.n_layers, len(positions), hook.n_heads, dtype=torch.bool)
        for b in range(0, len(positions), 2):  # every other variant ablates one head
            mask[b % hook.n_layers, b, b % hook.n_heads] = True
        variants = Variants(positions, [ids[q] for q in positions], mask, pre.mu)
        assert [variants.positions[b] for chunk in variants.chunks(4) for b in chunk] == sorted(positions,
                                                                                               reverse=True)
        out = run_variants(small_model, hook, pre.cache, variants, max_batch=4, record_rows=[1, 4])
        for b, q in enumerate(positions):
            brute = brute_force_logits(small_model, hook, ids[:q], ids[q], mask[:, b], pre.mu)
            assert (out.logits[b] - brute).abs().max() < 1e-5, (b, q)
        with hook.recording() as rec:
            small_model(input_ids=torch.tensor([ids[:24]]))
        # recorded in record_rows' order: variant 1 (at 10, nothing replaced), variant 4 (at 23, one head)
        assert torch.allclose(out.recorded[0], torch.stack([r[0, 10] for r in rec]), atol=1e-5)
        kept = mask[:, 4].logical_not()
        kept[2:] = False  # layer 1 is ablated at variant 4: the heads after it read another residual stream
        assert torch.allclose(out.recorded[1][kept], torch.stack([r[0, 23] for r in rec])[kept], atol=1e-5)
        assert torch.equal(out.recorded[1][mask[:, 4]], pre.mu[mask[:, 4]])  # the replaced head holds its mean
    finally:
        hook.remove()


def test_a_position_above_an_overwritten_one_is_refused(small_model):
    """Variants write their keys into the cache from their position on: a later forward higher up
    would read them as the note's, so it is an error, not a wrong number."""
    ids = _ids(7)
    hook = HeadHook(small_model)
    try:
        pre = prefill(small_model, hook, ids)
        forward_variants(small_model, hook, pre.cache, 20, ids[20], None, 3)
        forward_variants(small_model, hook, pre.cache, 12, ids[12], None, 3)  # lower: fine
        with pytest.raises(RuntimeError, match="overwritten"):
            forward_variants(small_model, hook, pre.cache, 30, ids[30], None, 1)
    finally:
        hook.remove()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_variants_of_different_events_on_cuda_equal_brute_force():
    """The mixed-position forwards (masked attention) on CUDA: fp32 against the full forward of each
    prefix, and the bf16 model within bf16 rounding of it."""
    from mistill.instrument.patching import Variants, run_variants
    from mistill.models.loading import cast_weights
    from tests.instrument.conftest import tiny_qwen3

    torch.manual_seed(0)
    model32 = tiny_qwen3(211, layers=3, heads=8, kv_heads=2, head_dim=64).cuda()
    torch.manual_seed(0)
    model16 = cast_weights(tiny_qwen3(211, layers=3, heads=8, kv_heads=2, head_dim=64).cuda(), torch.bfloat16)
    ids = _ids(11, n=300)
    positions = [290, 40, 170, 290, 99, 12, 170, 250, 61, 133]
    margins = []
    for model in (model32, model16):
        hook = HeadHook(model)
        try:
            pre = prefill(model, hook, ids)
            mask = torch.zeros(hook.n_layers, len(positions), hook.n_heads, dtype=torch.bool)
            for b in range(0, len(positions), 2):
                mask[b % hook.n_layers, b, b % hook.n_heads] = True
            out = run_variants(model, hook, pre.cache, Variants(positions, [ids[q] for q in positions],
                                                                mask.cuda(), pre.mu), max_batch=4)
            if model is model32:
                for b, q in enumerate(positions):
                    brute = brute_force_logits(model, hook, ids[:q], ids[q], mask[:, b].cuda(), pre.mu)
                    assert (out.logits[b] - brute).abs().max() < 1e-4, (b, q)
            margins.append(margin(out.logits.float().cpu(), 5, [7, 11, 13]))
        finally:
            hook.remove()
    assert (margins[0] - margins[1]).abs().max() < 0.1  # bf16 rounding only
