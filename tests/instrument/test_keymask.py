"""The key-side intervention against the plain path, a hand computation and a slow full forward (R-C10)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from transformers import AttentionInterface

from mistill.instrument import readside as rs
from mistill.instrument.events import extract_events, note_rng
from mistill.instrument.hook import HeadHook
from mistill.instrument.keymask import (
    KeyBlock,
    NamedRead,
    control_keys,
    control_units,
    event_keys,
    key_blocked_logits,
    key_intervention_note,
)
from mistill.instrument.margin import margin
from mistill.instrument.patching import brute_force_logits, forward_at, prefill
from mistill.world.prompt import build_prompt
from tests.instrument.conftest import INVENTORY, random_ids, tiny_qwen3

SEQ = 48


def _ids(seed=0, n=SEQ, vocab=211):
    return random_ids(seed, n, vocab)


# ---- the slow reference: a full eager forward with the head's last row blocked ------------------------

_SLOW = "mistill_test_keymask_slow"
_SLOW_BLOCKS: dict[int, list[tuple[int, list[int]]]] = {}


def _slow_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention under a causal mask built here; in the last row, the listed (head, keys) are cut."""
    T, lowest = query.shape[2], torch.finfo(query.dtype).min
    mask = torch.full((1, query.shape[1], T, T), lowest, dtype=query.dtype).triu(1)
    for head, keys in _SLOW_BLOCKS.get(int(module.layer_idx), []):
        mask[0, head, T - 1, keys] = lowest
    eager = sys.modules[type(module).__module__].eager_attention_forward
    return eager(module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs)


AttentionInterface.register(_SLOW, _slow_attention)


@torch.no_grad()
def _slow_logits(model, ids, q, block: KeyBlock) -> torch.Tensor:
    """Logits [V] at q of a full forward of ids[:q+1], the block's heads unable to read its keys at row q."""
    _SLOW_BLOCKS.clear()
    for layer, head in block.heads:
        _SLOW_BLOCKS.setdefault(layer, []).append((head, list(block.keys)))
    own = model.config._attn_implementation
    model.config._attn_implementation = _SLOW
    try:
        out = model(input_ids=torch.tensor([ids[:q + 1]]), use_cache=False, logits_to_keep=1)
    finally:
        model.config._attn_implementation = own
        _SLOW_BLOCKS.clear()
    return out.logits[0, -1].float()


# ---- the mechanism ----------------------------------------------------------------------------------


def test_empty_key_set_is_the_plain_path_bit_for_bit():
    model = tiny_qwen3(211, attn="eager", seed=3)
    ids = _ids(1)
    hook = HeadHook(model)
    try:
        pre = prefill(model, hook, ids, reserve=8, logit_positions=list(range(SEQ)))
        for q in (41, 26):
            refs = [KeyBlock(((1, 2),)), KeyBlock(((0, 1), (2, 3))), KeyBlock(())]
            got = key_blocked_logits(model, hook, pre.cache, q, ids[q], refs)
            plain = forward_at(model, hook, pre.cache, [q] * 3, [ids[q]] * 3, None)
            assert torch.equal(got, plain)
            one = key_blocked_logits(model, hook, pre.cache, q, ids[q], refs[:1])
            assert torch.equal(one, forward_at(model, hook, pre.cache, [q], [ids[q]], None))
            assert torch.allclose(one[0], pre.logits[q], atol=1e-5)
            assert model.config._attn_implementation == "eager"  # restored
    finally:
        hook.remove()


def test_one_remaining_key_gives_its_value_and_other_heads_are_untouched(small_model):
    ids = _ids(2)
    q, layer, head, kept = 30, 1, 3, 7
    hook = HeadHook(small_model)
    try:
        pre = prefill(small_model, hook, ids, reserve=8)
        others = tuple(j for j in range(q + 1) if j != kept)  # key q (the token itself) included
        runs = []
        for block in (KeyBlock(((layer, head),)), KeyBlock(((layer, head),), others)):
            # one variant per forward: the variant's own key sits in the same column in both
            with hook.recording() as rec:
                key_blocked_logits(small_model, hook, pre.cache, q, ids[q], [block])
            runs.append([r[0, 0] for r in rec])  # per layer [H, D]
        groups = hook.n_heads // small_model.config.num_key_value_heads
        value = pre.cache.layers[layer].value_buffer[0, head // groups, kept]
    finally:
        hook.remove()
    reference, blocked = runs
    assert torch.allclose(blocked[layer][head], value, atol=1e-6)
    assert (reference[layer][head] - value).abs().max() > 1e-2  # the reference reads more than that key
    rest = [h for h in range(hook.n_heads) if h != head]
    assert torch.equal(blocked[layer][rest], reference[layer][rest])
    for earlier in range(layer):
        assert torch.equal(blocked[earlier], reference[earlier])


def test_cached_blocks_equal_a_slow_full_forward_with_gqa(small_model):
    assert small_model.config.num_key_value_heads < small_model.config.num_attention_heads
    ids = _ids(3)
    rng = np.random.default_rng(0)
    hook = HeadHook(small_model)
    try:
        pre = prefill(small_model, hook, ids, reserve=8)
        for q in (44, 31, 17):  # decreasing: the cache is only cropped
            blocks = [KeyBlock(((int(rng.integers(3)), int(rng.integers(4))),),
                               tuple(int(j) for j in rng.choice(q + 1, size=int(rng.integers(1, q)), replace=False)))
                      for _ in range(3)]
            blocks.append(KeyBlock(((0, 1), (2, 0)), tuple(range(0, q + 1, 2))))  # a pair, key q included
            fast = key_blocked_logits(small_model, hook, pre.cache, q, ids[q], [KeyBlock(()), *blocks])
            plain = _slow_logits(small_model, ids, q, KeyBlock(()))
            assert (fast[0] - plain).abs().max() < 1e-5
            moved = 0.0
            for b, block in enumerate(blocks, start=1):
                slow = _slow_logits(small_model, ids, q, block)
                assert (fast[b] - slow).abs().max() < 1e-5, (q, block)
                moved = max(moved, float((slow - plain).abs().max()))
            assert moved > 1e-2  # the blocks change the logits, so the test can fail
    finally:
        hook.remove()


def test_variants_in_one_forward_equal_one_at_a_time(small_model):
    ids = _ids(4)
    q = 35
    blocks = [KeyBlock(((1, 0),)), KeyBlock(((1, 0),), (3, 4, 5, 20)), KeyBlock(((2, 3), (0, 2)), (0, 1, 2, q)),
              KeyBlock(((1, 0),), tuple(range(10, 30)))]
    hook = HeadHook(small_model)
    try:
        pre = prefill(small_model, hook, ids, reserve=8)
        together = key_blocked_logits(small_model, hook, pre.cache, q, ids[q], blocks)
        chunked = key_blocked_logits(small_model, hook, pre.cache, q, ids[q], blocks, max_batch=3)
        alone = torch.cat([key_blocked_logits(small_model, hook, pre.cache, q, ids[q], [b]) for b in blocks])
    finally:
        hook.remove()
    assert (together - alone).abs().max() < 1e-5
    assert (together - chunked).abs().max() < 1e-5
    assert (together[1] - together[0]).abs().max() > 1e-3


def test_blocking_every_key_or_a_future_key_is_refused(small_model):
    hook = HeadHook(small_model)
    try:
        pre = prefill(small_model, hook, _ids(5), reserve=4)
        with pytest.raises(ValueError, match="every key"):
            key_blocked_logits(small_model, hook, pre.cache, 10, 1, [KeyBlock(((0, 0),), tuple(range(11)))])
        with pytest.raises(ValueError, match=r"\[0, 10\]"):
            key_blocked_logits(small_model, hook, pre.cache, 10, 1, [KeyBlock(((0, 0),), (11,))])
    finally:
        hook.remove()


# ---- one note ---------------------------------------------------------------------------------------

COMPLETION = ("<think>\nconsider N18.4 stage 4 and J44.1, then N18.3 stage 3, so E11.65 and I10 and N18.4 again."
              '\n</think>\n\n["N18.4", "E11.65"]')
NAMED = [NamedRead("region", ((1, 2),), "P1", "region"),
         NamedRead("loop", ((0, 1), (1, 3)), "P2C", "near_miss"),
         NamedRead("line", ((1, 0),), "P2C", "near_miss_line"),
         NamedRead("none", ((0, 0),), "P1", "near_miss")]  # P1 has no near-miss: never any named keys


@pytest.fixture(scope="module")
def note(tokenizer):
    prompt = build_prompt("patient with kidney disease and diabetes and reflux", [f"{c} {d}" for c, d in INVENTORY])
    chat = tokenizer.chat_prompt(prompt)
    text = chat + COMPLETION
    enc = tokenizer.encode(text)
    events, _ = extract_events(note_id="n0", text=text, ids=enc.ids, offsets=enc.offsets, completion_start=len(chat),
                               codes=[c for c, _ in INVENTORY], tokenizer=tokenizer, n_null=0, seed=0)
    layout = rs.note_layout(text, enc.offsets, prompt, len(chat))
    return list(enc.ids), events, layout


def test_control_keys_are_whole_units_of_the_matching_kind_and_seeded(note):
    ids, events, layout = note
    checked = 0
    for ev in events:
        for read in NAMED[:3]:
            if read.phase != ev.kind:
                continue
            q = ev.pos - 1
            cats = rs.event_categories(layout, code=ev.code, near_miss=ev.near_miss, anchor=ev.anchor,
                                       prefix=ev.prefix or "", upto=q)
            named, control = event_keys(layout, ev, read, seed=0, note_id="n0")
            wanted = {"region": rs.REGION_CATEGORIES, "near_miss": ("trace_N",),
                      "near_miss_line": ("near_miss_line",)}[read.keys]
            assert named == tuple(j for j in range(q + 1) if rs.CATEGORIES[cats[j]] in wanted)
            assert named and max(named) < q
            units = control_units(layout, cats, read.keys)
            available = sum(len(u) for u in units)
            assert len(control) == min(len(named), available)
            kind = "other_chapter_lines" if read.keys != "near_miss" else "trace_other_codes"
            assert all(rs.CATEGORIES[cats[j]] == kind for j in control)
            # whole units, except the one cut at n
            partial = [u for u in units if 0 < len(set(u) & set(control)) < len(u)]
            assert len(partial) <= 1
            assert event_keys(layout, ev, read, seed=0, note_id="n0") == (named, control)
            again = control_keys(layout, cats, read.keys, len(named), note_rng(0, f"n0:{ev.pos}:{read.role}"))
            assert again == control
            checked += 1
    assert checked >= 6
    # the draw depends on the seed
    ev = next(e for e in events if e.kind == "P1")
    draws = {event_keys(layout, ev, NAMED[0], seed=s, note_id="n0")[1] for s in range(6)}
    assert len(draws) > 1


def test_note_rows_match_direct_computations(qwen_model, note):
    ids, events, layout = note
    hook = HeadHook(qwen_model)
    try:
        pre = prefill(qwen_model, hook, ids, reserve=16)
        rows = key_intervention_note(qwen_model, hook, pre, ids, events, layout, NAMED, seed=0, note_id="n0",
                                     max_batch=16)
        pre = prefill(qwen_model, hook, ids, reserve=16)
        again = key_intervention_note(qwen_model, hook, pre, ids, events, layout, NAMED, seed=0, note_id="n0",
                                      max_batch=16)
        assert rows == again

        expected = [(ev, read) for ev in events for read in NAMED
                    if read.phase == ev.kind and event_keys(layout, ev, read, seed=0, note_id="n0")[0]]
        assert [(r["pos"], r["role"]) for r in rows] == [(ev.pos, read.role) for ev, read in expected]
        assert {r["role"] for r in rows} == {"region", "loop", "line"}
        n_heads = hook.n_heads
        for row, (ev, read) in zip(rows, expected):
            q = ev.pos - 1
            named, control = event_keys(layout, ev, read, seed=0, note_id="n0")
            assert row["heads"] == [layer * n_heads + head for layer, head in read.heads]
            assert (row["n_named"], row["n_control"]) == (len(named), len(control))
            assert row["n_control"] == row["n_named"]  # enough control tokens in this note

            def m(logits, ev=ev):
                return float(margin(logits, ev.target_id, ev.competitor_ids))

            clean = m(_slow_logits(qwen_model, ids, q, KeyBlock(())))
            head_mask = torch.zeros(hook.n_layers, n_heads, dtype=torch.bool)
            for layer, head in read.heads:
                head_mask[layer, head] = True
            ablated = m(brute_force_logits(qwen_model, hook, ids[:q], ids[q], head_mask, pre.mu))
            blocked_named = m(_slow_logits(qwen_model, ids, q, KeyBlock(read.heads, named)))
            blocked_control = m(_slow_logits(qwen_model, ids, q, KeyBlock(read.heads, control)))
            assert row["margin_clean"] == pytest.approx(clean, abs=1e-4)
            assert row["margin_reference"] == pytest.approx(clean, abs=1e-4)
            assert row["margin_ablated"] == pytest.approx(ablated, abs=1e-4)
            assert row["margin_named"] == pytest.approx(blocked_named, abs=1e-4)
            assert row["margin_control"] == pytest.approx(blocked_control, abs=1e-4)
            assert row["D_named"] == pytest.approx(clean - blocked_named, abs=2e-4)
            assert row["D_control"] == pytest.approx(clean - blocked_control, abs=2e-4)
            assert row["E"] == pytest.approx(clean - ablated, abs=2e-4)
            assert row["D_named"] == row["margin_reference"] - row["margin_named"]
            assert row["E"] == row["margin_clean"] - row["margin_ablated"]
            assert all(isinstance(row[k], float) for k in ("D_named", "D_control", "E", "margin_clean"))
        # the blocks and the heads matter, well above the tolerance, so the test can fail
        assert max(abs(r["D_named"]) for r in rows) > 3e-3
        assert max(abs(r["E"]) for r in rows) > 3e-2
    finally:
        hook.remove()
