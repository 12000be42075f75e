"""First-order attribution against finite differences, and the exact nominees against brute force."""

from __future__ import annotations

import copy

import numpy as np
import torch

from mistill.instrument.attribution import (
    Decision,
    RunningGlobalTop,
    exact_importance,
    fidelity,
    first_order_importance,
    nominees,
)
from mistill.instrument.hook import HeadHook, Replacement
from mistill.instrument.margin import margin
from mistill.instrument.patching import brute_force_logits, forward_variants, prefill

TARGET, COMPETITORS = 5, [7, 11, 13]


def _ids(seed, n=40, vocab=211):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_intact_first_order_is_the_derivative_of_the_margin_along_the_ablation(small_model):
    """I^fo_h = -d/de margin(z_h + e (mu_h - z_h)) at e = 0, checked by central differences in float64."""
    model = copy.deepcopy(small_model).double()
    hook = HeadHook(model)
    ids, q = _ids(0), 33
    pre = prefill(model, hook, ids)
    decision = Decision(q, ids[q], TARGET, COMPETITORS)
    _, fo = first_order_importance(model, hook, pre.cache, decision, pre.mu, "intact")
    _, fo_detached = first_order_importance(model, hook, pre.cache, decision, pre.mu, "detached")
    with hook.recording() as rec:
        forward_variants(model, hook, pre.cache, q, ids[q], None, 1)
    z = torch.stack([r[0, 0] for r in rec])  # [L, H, D]
    checked = []
    eps = 1e-2  # RMSNorm runs in float32 even in a float64 model: a larger step beats its rounding
    for layer in range(hook.n_layers):
        for head in range(hook.n_heads):
            mask = torch.zeros(hook.n_layers, 2, hook.n_heads, dtype=torch.bool)
            mask[layer, :, head] = True
            vals = z[:, None].repeat(1, 2, 1, 1)
            step = (pre.mu.double() - z)[layer, head]
            vals[layer, 0, head] += eps * step
            vals[layer, 1, head] -= eps * step
            out = forward_variants(model, hook, pre.cache, q, ids[q], Replacement(mask, vals), 2)
            m_plus, m_minus = margin(out, TARGET, COMPETITORS)
            derivative = float(m_plus - m_minus) / (2 * eps)
            assert abs(fo[layer, head] + derivative) < 1e-4 + 1e-3 * abs(derivative), (layer, head)
            checked.append(abs(derivative))
    assert max(checked) > 1e-2  # some heads matter, so the comparison can fail
    last = hook.n_layers - 1
    # the last layer has no later attention: both leaves agree there; earlier layers lose paths when detached
    assert np.allclose(fo[last], fo_detached[last], atol=1e-9)
    assert np.abs(fo[:last] - fo_detached[:last]).max() > 1e-4
    hook.remove()


def test_exact_importance_of_nominees_equals_brute_force(small_model):
    hook = HeadHook(small_model)
    ids, q = _ids(1), 30
    pre = prefill(small_model, hook, ids)
    heads = [(0, 1), (2, 3), (1, 0)]
    clean, effects = exact_importance(small_model, hook, pre.cache, Decision(q, ids[q], TARGET, COMPETITORS), pre.mu,
                                      heads, max_batch=2)
    plain = brute_force_logits(small_model, hook, ids[:q], ids[q], None, None)
    assert abs(clean - float(margin(plain, TARGET, COMPETITORS))) < 1e-5
    for (layer, head), effect in zip(heads, effects):
        mask = torch.zeros(hook.n_layers, hook.n_heads, dtype=torch.bool)
        mask[layer, head] = True
        ablated = brute_force_logits(small_model, hook, ids[:q], ids[q], mask, pre.mu)
        assert abs(effect - (clean - float(margin(ablated, TARGET, COMPETITORS)))) < 1e-5
    hook.remove()


def test_nominees_are_the_top_by_absolute_value_plus_the_running_global_top():
    fo = np.array([[0.1, -3.0, 0.2], [2.0, 0.0, -0.5]])
    running = RunningGlobalTop(2, 3)
    assert running.top(2) == []  # the first note has no global nominees
    running.update(np.array([[[0.0, 0.0, 5.0], [1.0, 0.0, 0.0]], [[0.0, 0.0, 3.0], [0.0, 0.0, 4.0]]]))
    assert running.top(2) == [(0, 2), (1, 2)]
    assert nominees(fo, 2, running.top(2)) == [(0, 1), (1, 0), (0, 2), (1, 2)]
    assert nominees(fo, 3, [(1, 2)]) == [(0, 1), (1, 0), (1, 2)]


def test_fidelity_statistics_on_a_hand_made_case():
    exact = np.array([[[1.0, 0.5, 0.0, -0.2]], [[0.0, 2.0, 1.0, 0.1]]])
    estimate = np.array([[[0.8, 0.7, 0.1, -0.1]], [[0.5, 1.0, 0.0, 0.2]]])
    out = fidelity(exact, estimate, floor=0.15, top_k=2)
    assert out["top_k_overlap"] == 1.5  # {0,1} vs {0,1}; {1,2} vs {1,0}
    assert np.isclose(out["top_k_effect_recovered"], np.mean([1.0, 2.0 / 3.0]))
    assert np.isclose(out["pearson"], np.corrcoef(exact.ravel(), estimate.ravel())[0, 1])
    assert out["heads_above_noise_per_event_min"] == 2 and out["heads_above_noise_per_event_max"] == 3


def test_integrated_gradients_with_many_steps_matches_the_exact_effect_sum(small_model):
    """IG over all heads at once is exact for the joint ablation: sum_h IG_h = m(z) - m(mu) (completeness)."""
    from mistill.instrument.attribution import integrated_gradients

    model = copy.deepcopy(small_model).double()
    hook = HeadHook(model)
    ids, q = _ids(2), 38
    pre = prefill(model, hook, ids)
    with hook.recording() as rec:
        clean = forward_variants(model, hook, pre.cache, q, ids[q], None, 1)
    z = torch.stack([r[0, 0] for r in rec])
    ig = integrated_gradients(model, hook, pre.cache, Decision(q, ids[q], TARGET, COMPETITORS), pre.mu.double(), z, 32)
    every = torch.ones(hook.n_layers, 1, hook.n_heads, dtype=torch.bool)
    ablated = forward_variants(model, hook, pre.cache, q, ids[q], Replacement(every, pre.mu.double()), 1)
    joint = float(margin(clean, TARGET, COMPETITORS) - margin(ablated, TARGET, COMPETITORS))
    assert abs(joint) > 1e-2
    assert abs(ig.sum() - joint) < 1e-3 * max(1.0, abs(joint))
    hook.remove()


def test_attribution_pass_batched_across_events_equals_one_event_at_a_time(small_model):
    """attribute_note packs the events of a note into shared forwards (3 per forward here, so the
    groups and the cache crops interleave); each event's margin, I^fo and exact patches equal
    those of the event measured alone against a fresh cache."""
    from mistill.instrument.attribution import attribute_note
    from mistill.instrument.events import Event

    ids = _ids(4)
    positions = [38, 12, 25, 31, 7, 19, 35]
    events = [Event(kind="P1" if n % 2 == 0 else "NULL", pos=p, target_id=TARGET + n,
                    competitor_ids=COMPETITORS, anchor=p) for n, p in enumerate(positions)]
    hook = HeadHook(small_model)
    try:
        pre = prefill(small_model, hook, ids, reserve=3)
        result = attribute_note(small_model, hook, pre.cache, pre.mu, ids, events, note_id="n", mode="intact",
                                nominees_topk=3, global_top=[(0, 0)], null_exact_share=0.5, max_batch=3)
        n_exact = 0
        for i, ev in enumerate(events):
            alone = prefill(small_model, hook, ids)
            clean, first = first_order_importance(small_model, hook, alone.cache, Decision.of(ev, ids), alone.mu,
                                                  "intact")
            assert abs(result.margin[i] - clean) < 1e-5
            assert np.abs(result.first_order[i] - first).max() < 1e-5
            measured = np.argwhere(~np.isnan(result.exact[i]))
            if ev.kind == "P1":
                assert len(measured) >= 3
            if len(measured):
                heads = [tuple(int(x) for x in h) for h in measured]
                _, effects = exact_importance(small_model, hook, alone.cache, Decision.of(ev, ids), alone.mu, heads,
                                              max_batch=64)
                assert np.abs(result.exact[i][tuple(measured.T)] - effects).max() < 1e-5
                n_exact += 1
        assert n_exact >= 4
    finally:
        hook.remove()
