"""The forcing probe, the walk-back and the window passes against slow, obvious forwards (App. F)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mistill.errors import UserError
from mistill.instrument.hook import HeadHook, Replacement
from mistill.instrument.patching import prefill
from mistill.locus.passes import LocusSettings, ablation_sets, description_words
from mistill.locus.probe import (
    ForcedTarget,
    ProbeMention,
    WalkSettings,
    classify,
    forced_targets,
    forward_sequences,
    walk_back,
)
from mistill.locus.window import Window, ablated_margins, ablation_mask, attribute_windows
from mistill.stats import necessity
from tests.instrument.conftest import random_ids, tiny_qwen3

SEQ = 60
TARGET = ForcedTarget(5, (6, 7, 8, 9))


@pytest.fixture(scope="module")
def model():
    m = tiny_qwen3(211, attn="sdpa")
    hook = HeadHook(m)
    yield m, hook
    hook.remove()


def _plain_last_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def test_sequences_after_the_cache_equal_full_forwards_of_each_cut(model):
    m, hook = model
    ids, suffix = random_ids(0, SEQ), [11, 12, 13]
    pre = prefill(m, hook, ids, reserve=64)
    cuts = [SEQ, 40, 17, 41, 1]            # any order: nothing is overwritten
    with torch.no_grad():
        got = forward_sequences(m, hook, pre.cache, cuts, [suffix] * len(cuts))
    assert pre.cache.get_seq_length() == SEQ
    for b, cut in enumerate(cuts):
        torch.testing.assert_close(got[b], _plain_last_logits(m, ids[:cut] + suffix), atol=1e-4, rtol=1e-4)
    # sequences of different lengths in one forward
    with torch.no_grad():
        mixed = forward_sequences(m, hook, pre.cache, [30, 20], [[3, 4, 5, 6], [7]])
    torch.testing.assert_close(mixed[0], _plain_last_logits(m, ids[:30] + [3, 4, 5, 6]), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mixed[1], _plain_last_logits(m, ids[:20] + [7]), atol=1e-4, rtol=1e-4)


def test_an_ablation_in_a_sequence_equals_the_ablated_full_forward(model):
    m, hook = model
    ids = random_ids(1, SEQ)
    pre = prefill(m, hook, ids, reserve=256)
    window = Window.at(ids, 50, 16, 5, [11, 12, 13], TARGET)
    heads = [0 * 4 + 1, 2 * 4 + 3]
    clean, ablated = ablated_margins(m, hook, pre.cache, pre.mu, window, [(heads, "window"), (heads, "suffix"),
                                                                        (heads, "both"), ([], "both")], max_batch=3)
    full = list(ids[:50]) + [11, 12, 13]
    assert clean == pytest.approx(float(TARGET.margin(_plain_last_logits(m, full))), abs=1e-4)
    for place, got in zip(("window", "suffix", "both"), ablated[:3]):
        mask = torch.zeros(hook.n_layers, len(full), hook.n_heads, dtype=torch.bool)
        at = {"window": slice(34, 50), "suffix": slice(50, 53), "both": slice(34, 53)}[place]
        for flat in heads:
            mask[flat // 4, at, flat % 4] = True
        with torch.no_grad(), hook.replacing(Replacement(mask, pre.mu)):
            want = TARGET.margin(m(input_ids=torch.tensor([full])).logits[0, -1].float())
        assert got == pytest.approx(float(want), abs=1e-4)
    assert ablated[3] == pytest.approx(clean, abs=1e-6)              # ablating nothing changes nothing
    assert ablation_mask(window, heads, "window", 3, 4).sum() == 2 * 16


def test_window_attribution_equals_the_gradient_of_a_full_forward(model):
    m, hook = model
    ids = random_ids(2, SEQ)
    pre = prefill(m, hook, ids, reserve=256)
    windows = [Window.at(ids, 45, 12, 3, [11, 12], TARGET), Window.at(ids, 20, 12, 3, [11, 12], ForcedTarget(7, (5, 6)))]
    together = attribute_windows(m, hook, pre.cache, pre.mu, windows)
    for b, w in enumerate(windows):
        full = list(ids[:w.cut]) + list(w.suffix)
        with torch.enable_grad(), hook.gradient_leaves("intact") as leaves:
            logits = m(input_ids=torch.tensor([full])).logits[0, -1].float()
            margin = w.target.margin(logits)
            grads = torch.autograd.grad(margin, [d for _, d in leaves])
        score = torch.stack([((z[0] - pre.mu[layer]) * g[0]).sum(-1) for layer, ((z, _), g)
                             in enumerate(zip(leaves, grads))], dim=1)          # [T, L, H]: I = -A
        assert together.margin[b] == pytest.approx(float(margin.detach()), abs=1e-4)
        np.testing.assert_allclose(together.window[b], score[w.start:w.cut].sum(0).numpy(), atol=1e-4)
        np.testing.assert_allclose(together.suffix[b], score[w.cut:].sum(0).numpy(), atol=1e-4)


def test_first_order_window_importance_tracks_the_exact_window_ablation(model):
    """Summed over a whole window, -A of one head estimates that head's exact window-only ablation effect."""
    m, hook = model
    ids = random_ids(3, SEQ)
    pre = prefill(m, hook, ids, reserve=512)
    window = Window.at(ids, 52, 8, 3, [11, 12], TARGET)
    estimate = attribute_windows(m, hook, pre.cache, pre.mu, [window]).window[0].reshape(-1)
    clean, ablated = ablated_margins(m, hook, pre.cache, pre.mu, window, [([h], "window") for h in range(12)], 12)
    exact = clean - ablated
    assert np.corrcoef(estimate, exact)[0, 1] > 0.5


def _walk(curve: dict[int, float], pos=200, floor=0, previous_end=0, **settings):
    mention = ProbeMention(0, pos, floor, previous_end, TARGET)
    calls = []

    def probe(pairs):
        calls.append(len(pairs))
        return [curve(d) for _, d in pairs]

    (result,) = walk_back(probe, [mention], WalkSettings(**settings))
    return result, calls


def test_walk_back_refines_the_crossing_token_by_token():
    result, calls = _walk(lambda d: 9.0 if d <= 13 else -1.0, previous_end=100)
    # coarse cuts 0, 8, 16: the crossing lies in (8, 16]; the scan 9..15 finds d = 14 failing first
    assert result.outcome == "window" and result.distance == 13
    assert result.jump == pytest.approx(10.0)
    assert sorted(result.curve) == [0, 8, *range(9, 16), 16, 24, 32, 40, 48]
    assert calls == [1, 1, 1, 11]                       # one batch per round, then the scan and four steps


def test_walk_back_outcomes():
    never, _ = _walk(lambda d: 1.0)
    assert never.outcome == "never" and never.distance is None
    code, _ = _walk(lambda d: 5.0 if d == 0 else 0.0)
    assert code.outcome == "code" and code.distance == 0
    inherited, _ = _walk(lambda d: 5.0 if d <= 60 else 0.0, previous_end=170)
    assert inherited.outcome == "inherited" and inherited.distance == 60
    start, _ = _walk(lambda d: 5.0, pos=30, floor=10, previous_end=10)
    assert start.outcome == "inherited" and start.distance == 20 and start.locus == 10
    censored, _ = _walk(lambda d: 5.0, pos=900, floor=0, previous_end=0, max_back=64)
    assert censored.outcome == "censored" and censored.distance == 64


def test_classify_at_the_previous_codes_end():
    m = ProbeMention(0, 100, 0, 90, TARGET)
    assert classify(m, 10, None) == "inherited"      # the locus is the previous code's end itself
    assert classify(m, 9, None) == "window"


def test_forced_targets_compete_against_every_other_letter():
    targets = forced_targets({"A": 1, "C": 3, "B": 2})
    assert targets["B"] == ForcedTarget(2, (1, 3))
    logits = torch.zeros(5)
    logits[2] = 3.0
    assert float(targets["B"].margin(logits)) == pytest.approx(3.0 - np.log(2.0), abs=1e-6)


def test_necessity_and_the_ablation_sets():
    assert necessity(np.full(3, 4.0), np.array([0.0, 4.0, 6.0])).tolist() == [1.0, 0.0, -0.5]
    settings = LocusSettings.from_params({"locus": _section()})
    prose = np.arange(12, dtype=float)
    sets = ablation_sets(prose, -prose, np.zeros(12), settings, np.random.default_rng(0))
    assert sets["prosetime_top2_window"] == ([11, 10], "window")
    assert sets["emission_top4_suffix"] == ([0, 1, 2, 3], "suffix")
    assert sets["prosetime_bottom2_window"] == ([0, 1], "window")
    assert len(set(sets["random4_window"][0])) == 4
    assert description_words("other specified congenital deformity of hip") == {"congenital", "deformity"}


def _section(**overrides):
    section = {"out_dir": "x", "shortlist_out_dir": "y", "follow_out_dir": "z", "min_forced_drop": 1.0, "suffix": " the code is", "letter_prefix": " ", "theta": 2.0, "step": 8,
               "max_back": 512, "extra_steps": 4, "window": 64, "k": [2, 4], "overlap_k": [2, 4],
               "layers": [1, 2], "pool_k": 4, "max_batch": 8, "attribution_batch": 4, "suffix_leader": "l0h0"}
    return {**section, **overrides}


@pytest.mark.parametrize("overrides, words", [({"suffix": ""}, "suffix"), ({"window": 0}, "window"),
                                              ({"k": []}, "k needs"), ({"bogus": 1}, "bogus")])
def test_bad_settings_are_one_line_errors(overrides, words):
    with pytest.raises(UserError, match=words):
        LocusSettings.from_params({"locus": _section(**overrides)})


def test_follow_through_variants_equal_ablated_full_forwards(model):
    from mistill.locus.follow import VARIANTS, follow_mention

    m, hook = model
    ids = random_ids(4, SEQ)
    pre = prefill(m, hook, ids, reserve=1024)
    locus, pos = 40, 52                                   # window [24, 40), continuation 40..51, letter at 52
    window = Window.at(ids, locus, 16, 3, [11, 12], TARGET)
    natural = ForcedTarget(21, (22, 23, 24))
    sets = {"prose": [1, 6], "random": [3, 9], "emission": [4, 10]}
    got = follow_mention(m, hook, pre.cache, pre.mu, ids, window, pos, natural, sets)
    places = {"clean": ([], slice(0, 0)), "prose": ([1, 6], slice(24, 40)), "random": ([3, 9], slice(24, 40)),
              "sustained": ([1, 6], slice(24, 52)), "emission": ([4, 10], slice(51, 52))}
    for name in VARIANTS:
        heads, at = places[name]
        mask = torch.zeros(hook.n_layers, pos, hook.n_heads, dtype=torch.bool)
        for flat in heads:
            mask[flat // 4, at, flat % 4] = True
        with torch.no_grad(), hook.replacing(Replacement(mask, pre.mu)):
            want = natural.margin(m(input_ids=torch.tensor([ids[:pos]])).logits[0, -1].float())
        assert got["natural"][name] == pytest.approx(float(want), abs=1e-4), name
    clean, ablated = ablated_margins(m, hook, pre.cache, pre.mu, window, [([1, 6], "window")], 4)
    assert got["forced_drop"] == pytest.approx(clean - ablated[0], abs=1e-6)


def test_follow_through_ratio_flips_and_drops_by_hand():
    from mistill.locus.follow import flipped, follow_through_ratio, natural_drops

    rows = [{"natural": {"clean": 5.0, "prose": 4.0}, "forced_drop": 4.0},
            {"natural": {"clean": 3.0, "prose": -1.0}, "forced_drop": 6.0},
            {"natural": {"clean": 2.0, "prose": 2.0}, "forced_drop": 0.5}]     # below the 1-nat cut
    assert natural_drops(rows, "prose").tolist() == [1.0, 4.0, 0.0]
    ratio, natural, forced, n = follow_through_ratio(rows, 1.0)
    assert (natural, forced, n) == (2.5, 5.0, 2) and ratio == pytest.approx(0.5)
    assert flipped(rows) == 1
