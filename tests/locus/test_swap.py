"""The residual swap (App. F, R-C12) against slow full forwards, and its readouts by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mistill.errors import UserError
from mistill.instrument.hook import HeadHook
from mistill.instrument.patching import prefill
from mistill.locus.passes import SwapSettings
from mistill.locus.probe import ForcedTarget
from mistill.locus.swap import (
    ResidualStreams,
    SwapMention,
    analysis_layer,
    donor_target,
    drops,
    flip_layer,
    nearest_donor,
    place_offsets,
    ratio_of_medians,
    swap_mention,
    transport_ratio,
)
from mistill.locus.window import Window
from tests.instrument.conftest import random_ids, tiny_qwen3

SEQ, SUFFIX, WIDTH, TAIL = 80, [11, 12, 13], 12, 4
LETTERS = (5, 6, 7, 8, 9)


@pytest.fixture(scope="module")
def model():
    m = tiny_qwen3(211, layers=3, attn="sdpa")
    hook = HeadHook(m)
    streams = ResidualStreams(m)
    yield m, hook, streams
    streams.remove()
    hook.remove()


def _mention(ids, locus: int, pos: int, letter: int) -> SwapMention:
    target = ForcedTarget(letter, tuple(c for c in LETTERS if c != letter))
    return SwapMention(Window.at(ids, locus, WIDTH, 2, SUFFIX, target), pos, target)


def _hidden(model, ids: list[int]) -> list[torch.Tensor]:
    """Residual leaving every layer [T, D], by a plain forward (transformers' own hidden states for all but
    the last layer, whose entry there is after the final norm)."""
    last = []
    handle = model.model.layers[-1].register_forward_hook(lambda module, args, output: last.append(output))
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    finally:
        handle.remove()
    final = last[0][0] if isinstance(last[0], tuple) else last[0]
    return [h[0] for h in out.hidden_states[1:-1]] + [final[0]]


def _swapped_last_logits(model, ids: list[int], layer: int, at: list[int], values: torch.Tensor) -> torch.Tensor:
    """The slow reading: a full forward whose residual leaving `layer` is overwritten at absolute positions."""
    def hook(module, args, output):
        hidden = (output[0] if isinstance(output, tuple) else output).clone()
        hidden[0, at] = values
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = model.model.layers[layer].register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    finally:
        handle.remove()


def test_every_swap_equals_a_full_forward_with_the_donor_residual_written_in(model):
    m, hook, streams = model
    ids = random_ids(3, SEQ)
    target, donor = _mention(ids, 60, 66, 5), _mention(ids, 40, 43, 7)
    pre = prefill(m, hook, ids, reserve=512)
    got = swap_mention(m, hook, streams, pre.cache, ids, target, donor, [0, 1, 2], TAIL, max_batch=5)
    assert pre.cache.get_seq_length() == SEQ
    donor_hidden = _hidden(m, ids[:43])
    forced_ids, natural_ids = ids[:60] + SUFFIX, ids[:66]
    forced_donor = donor_target(target.window.target, donor.window.target)
    # the clean margins are the plain forwards'
    plain = _swapped_last_logits(m, forced_ids, 0, [], torch.zeros(0, 32))
    assert got["forced"]["clean"][0] == pytest.approx(float(target.window.target.margin(plain)), abs=1e-4)
    assert got["forced"]["clean"][1] == pytest.approx(float(forced_donor.margin(plain)), abs=1e-4)
    donor_places = {"locus": [39], "tail": [36, 37, 38, 39], "code": [42]}
    target_places = {"locus": [59], "tail": [56, 57, 58, 59], "code": [65]}
    for layer in (0, 1, 2):
        for place in ("locus", "tail", "code"):
            values = donor_hidden[layer][donor_places[place]]
            kinds = ("natural",) if place == "code" else ("forced", "natural")
            for kind in kinds:
                full = forced_ids if kind == "forced" else natural_ids
                want = _swapped_last_logits(m, full, layer, target_places[place], values)
                t = target.window.target if kind == "forced" else target.natural
                assert got[kind][place][layer][0] == pytest.approx(float(t.margin(want)), abs=2e-4), (kind, place)


def test_a_mention_swapped_with_itself_keeps_its_margins(model):
    m, hook, streams = model
    ids = random_ids(4, SEQ)
    mention = _mention(ids, 55, 61, 6)
    pre = prefill(m, hook, ids, reserve=512)
    got = swap_mention(m, hook, streams, pre.cache, ids, mention, mention, [0, 1, 2], TAIL, max_batch=4)
    for kind in ("forced", "natural"):
        for place, rows in got[kind].items():
            if place == "clean":
                continue
            for row in rows:
                assert row == pytest.approx(got[kind]["clean"], abs=1e-4)


def test_the_last_layer_code_swap_hands_over_the_donors_own_decision(model):
    m, hook, streams = model
    ids = random_ids(5, SEQ)
    target, donor = _mention(ids, 62, 70, 5), _mention(ids, 30, 35, 8)
    pre = prefill(m, hook, ids, reserve=512)
    got = swap_mention(m, hook, streams, pre.cache, ids, target, donor, [2], TAIL, max_batch=8)
    # the final residual at the code token is the donor's: the logits are the donor's at its own code token
    with torch.no_grad():
        donor_logits = m(input_ids=torch.tensor([ids[:35]])).logits[0, -1].float()
    assert got["natural"]["code"][0][0] == pytest.approx(float(target.natural.margin(donor_logits)), abs=1e-4)
    natural_donor = donor_target(target.natural, donor.natural)
    assert got["natural"]["code"][0][1] == pytest.approx(float(natural_donor.margin(donor_logits)), abs=1e-4)


def test_streams_are_inert_without_writes(model):
    m, _, streams = model
    ids = random_ids(6, 30)
    with torch.no_grad():
        plain = m(input_ids=torch.tensor([ids])).logits
        with streams.capturing([0, 5]) as captured:
            hooked = m(input_ids=torch.tensor([ids])).logits
    assert torch.equal(plain, hooked)
    hidden = _hidden(m, ids)
    for layer in range(3):
        torch.testing.assert_close(captured[layer], hidden[layer][[0, 5]])


def test_places_donors_and_the_donor_target():
    assert place_offsets("locus", 12, 20, 8) == [11]
    assert place_offsets("tail", 12, 20, 8) == [4, 5, 6, 7, 8, 9, 10, 11]
    assert place_offsets("tail", 3, 9, 8) == [0, 1, 2]                  # a window clipped at the trace start
    assert place_offsets("code", 12, 20, 8) == [19]
    # nearest other chapter, the earlier on a tie; none when the note has one chapter
    mentions = [(10, "A"), (20, "A"), (30, "B"), (40, "C"), (50, "A")]
    assert [nearest_donor(mentions, i) for i in range(5)] == [2, 2, 1, 2, 3]
    assert nearest_donor([(10, "A"), (20, "A")], 0) is None
    assert donor_target(ForcedTarget(5, (6, 7)), ForcedTarget(7, (5, 6))) == ForcedTarget(7, (5, 6))


def _row(forced: list[float], natural: list[float], code_donor: list[float]) -> dict:
    """A swap row with clean margins 10 (target) / -5 (donor); drops as given per layer."""
    return {"forced": {"clean": [10.0, -5.0], "tail": [[10.0 - d, -5.0] for d in forced], "locus": []},
            "natural": {"clean": [8.0, -5.0], "tail": [[8.0 - d, -5.0 + d / 2] for d in natural],
                        "code": [[0.0, g] for g in code_donor]}}


def test_the_readouts_by_hand():
    layers = [0, 4, 8]
    rows = [_row([2.0, 6.0, 1.0], [1.0, 3.0, 0.5], [-1.0, 2.0, 3.0]),
            _row([4.0, 8.0, 0.5], [1.0, 2.0, 0.5], [-2.0, -1.0, 4.0]),
            _row([0.5, 10.0, 2.0], [0.1, 6.0, 1.0], [-3.0, 1.0, 5.0])]
    assert analysis_layer(rows, layers) == 4                         # medians 2, 8, 1
    # at l* = 4 every forced drop exceeds 1: ratios 0.5, 0.25, 0.6 -> median 0.5
    assert transport_ratio(rows, 1, 1.0) == (pytest.approx(0.5), 3)
    # at layer 0 only forced drops 2 and 4 exceed 1: ratios 0.5, 0.25 -> 0.375
    assert transport_ratio(rows, 0, 1.0) == (pytest.approx(0.375), 2)
    assert ratio_of_medians(rows, 2) == pytest.approx(0.5 / 1.0)
    assert drops(rows, "natural", "tail", 1).tolist() == [3.0, 2.0, 6.0]
    assert flip_layer(rows, layers) == 4                             # donor medians -2, 1, 4
    rows[0]["natural"]["code"][2][1] = -9.0
    rows[1]["natural"]["code"][2][1] = -9.0
    assert flip_layer(rows, layers) is None                          # the deepest layer no longer hands over
    assert np.isnan(transport_ratio(rows, 2, 5.0)[0])


def test_swap_settings_refuse_a_bad_grid():
    base = {"name": "demo", "locus": {"swap": {"out_dir": "x", "layers": [0, 2], "tail": 8}}}
    assert SwapSettings.from_params(base).layers == (0, 2)
    for bad in ({"out_dir": "x", "layers": [2, 0], "tail": 8}, {"out_dir": "x", "layers": [0], "tail": 0},
                {"out_dir": "x", "tail": 8}):
        with pytest.raises(UserError, match="locus.swap"):
            SwapSettings.from_params({"name": "demo", "locus": {"swap": bad}})
    with pytest.raises(UserError, match="missing"):
        SwapSettings.from_params({"name": "demo", "locus": {}})
