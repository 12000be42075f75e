"""Prefix and note edits against the slow, obvious full forward of the edited input (App. E)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mistill.instrument import edits as ed
from mistill.instrument.events import extract_events
from mistill.instrument.hook import HeadHook
from mistill.instrument.margin import margin
from mistill.instrument.patching import brute_force_logits, prefill
from mistill.world.prompt import build_prompt

INVENTORY = {
    "E11.65": "type 2 diabetes mellitus with hyperglycemia",
    "E11.9": "type 2 diabetes mellitus without complications",
    "E10.9": "type 1 diabetes mellitus without complications",
    "N18.3": "chronic kidney disease stage 3",
    "N18.4": "chronic kidney disease stage 4",
    "N17.9": "acute kidney failure unspecified",
    "J44.1": "chronic obstructive pulmonary disease with exacerbation",
    "K21.9": "gastro esophageal reflux disease without esophagitis",
    "I10": "essential hypertension",
}
NOTE = ("elderly man admitted with hyperglycemia and high glucose despite insulin no other complications "
        "chronic kidney function stable wheezing from copd exacerbation treated hyperglycemia resolved")
PROSE = "the summary was read again and the findings were weighed with care before any choice"
COMPLETION = (
    "<think>\n" + PROSE + ".\n"
    "E11.9 type 2 diabetes mellitus without complications is ruled out.\n"
    "N18.4 chronic kidney disease stage 4 is considered.\n"
    "E11.65 type 2 diabetes mellitus with hyperglycemia fits.\n"
    "N18.3 chronic kidney disease stage 3 fits. Again N18.4 was weighed and N18.3 kept, E11.65 kept.\n"
    + PROSE + ".\n</think>\n\n[\"E11.65\", \"N18.3\"]"
)
HEADS = ((1, 0), (1, 3))
TOL = 1e-5


def _note(tokenizer) -> ed.NoteInput:
    prompt = build_prompt(NOTE, [f"{c} {d}" for c, d in INVENTORY.items()])
    chat = tokenizer.chat_prompt(prompt)
    enc = tokenizer.encode(chat + COMPLETION)
    return ed.NoteInput("n1", chat + COMPLETION, list(enc.ids), [tuple(o) for o in enc.offsets], len(chat), prompt)


def _events(tokenizer, note):
    events, _ = extract_events(note_id=note.note_id, text=note.text, ids=note.ids, offsets=note.offsets,
                               completion_start=note.completion_start, codes=list(INVENTORY),
                               tokenizer=tokenizer, n_null=4)
    return events


def _settings(tokenizer, **kw) -> ed.EditSettings:
    return ed.EditSettings(filler_id=ed.filler_token_id(tokenizer), mediation_heads=HEADS, **kw)


def _brute_margin(model, hook, seq, event, mu=None):
    q = event.pos - 1
    head_mask = None
    if mu is not None:
        head_mask = torch.zeros(hook.n_layers, hook.n_heads, dtype=torch.bool)
        for layer, head in HEADS:
            head_mask[layer, head] = True
    logits = brute_force_logits(model, hook, seq[:q], seq[q], head_mask, mu)
    return float(margin(logits, event.target_id, event.competitor_ids))


@pytest.fixture(scope="module")
def world(tokenizer):
    note = _note(tokenizer)
    return note, _events(tokenizer, note)


def test_filler_must_be_one_known_token(tokenizer):
    assert ed.filler_token_id(tokenizer, " .") == tokenizer.encode(" .").ids[0]
    assert ed.filler_token_id(tokenizer, " -") == tokenizer.encode(" -").ids[0]
    with pytest.raises(ValueError, match="not exactly one"):
        ed.filler_token_id(tokenizer, " two words")


def test_prefix_variants_keep_every_position_and_the_code_rules(tokenizer, world):
    note, events = world
    selected = ed.select_events(events, seed=0, note_id=note.note_id)
    assert {(e.code, e.near_miss) for e in selected} == {("E11.65", "E11.9"), ("N18.3", "N18.4"), ("N18.4", "N18.3")}
    filler = ed.filler_token_id(tokenizer)
    both = 0
    for e in selected:
        s, t = e.n_pos[-1]
        assert note.text[note.offsets[s][0]:note.offsets[t - 1][1]].strip() == e.near_miss
        variants = ed.prefix_variants(note, e, codes=list(INVENTORY), tokenizer=tokenizer, filler_id=filler, seed=0)
        assert variants["identity"].span_ids == note.ids[s:t]
        assert variants["filler"].span_ids == [filler] * (t - s)
        for kind in ("unrelated", "other_category"):
            v = variants[kind]
            if v is None:
                continue
            seq = note.ids[:s] + v.span_ids + note.ids[t:]
            assert len(seq) == len(note.ids) and len(v.span_ids) == t - s
            assert [j for j in range(len(seq)) if seq[j] != note.ids[j]] and \
                all(s <= j < t for j in range(len(seq)) if seq[j] != note.ids[j])
            at = note.text.index(e.near_miss, note.offsets[s][0])
            edited_text = note.text[:at] + v.replacement + note.text[at + len(v.replacement):]
            assert tokenizer.encode(edited_text).ids == seq  # the text edit, re-encoded
            assert ed.code_shape(v.replacement) == ed.code_shape(e.near_miss) and v.replacement in INVENTORY
            if kind == "unrelated":
                assert v.replacement[0] != e.near_miss[0]
            else:
                assert v.replacement[0] == e.near_miss[0] and v.replacement[:3] != e.near_miss[:3]
        both += variants["unrelated"] is not None and variants["other_category"] is not None
    assert both == len(selected)
    assert ed.replacement_candidates("E11.9", INVENTORY, "other_category") == ["E10.9"]
    assert ed.replacement_candidates("N18.4", INVENTORY, "unrelated") == ["E10.9", "E11.9", "J44.1", "K21.9"]


def test_seeded_choices_are_stable_and_depend_on_the_seed(tokenizer, world):
    note, events = world
    e = next(e for e in ed.select_events(events, seed=0, note_id="n1") if e.near_miss == "N18.4")
    kw = dict(codes=list(INVENTORY), tokenizer=tokenizer, filler_id=ed.filler_token_id(tokenizer))
    pick = lambda seed: ed.prefix_variants(note, e, seed=seed, **kw)["unrelated"].replacement
    assert pick(3) == pick(3)
    assert len({pick(seed) for seed in range(12)}) > 1
    subset = lambda seed: tuple(x.pos for x in ed.select_events(events, seed=seed, note_id="n1", max_events=2))
    assert subset(5) == subset(5) and len(subset(5)) == 2
    assert len({subset(seed) for seed in range(12)}) > 1
    per_note = {tuple(x.pos for x in ed.select_events(events, seed=0, note_id=f"n{i}", max_events=2))
                for i in range(12)}
    assert len(per_note) > 1  # ... and on the note


def test_prefix_edits_equal_brute_force(qwen_model, tokenizer, world):
    """Identity re-feed == the clean margin; each replacement (plain and mediation-ablated) == a full
    forward of the edited ids, to 1e-5, whatever the order the cache was visited in."""
    note, events = world
    settings = _settings(tokenizer)
    hook = HeadHook(qwen_model)
    try:
        pre = prefill(qwen_model, hook, note.ids)
        rows = ed.prefix_edit_note(qwen_model, hook, pre, note, events, codes=list(INVENTORY),
                                   tokenizer=tokenizer, settings=settings)
        by_pos = {e.pos: e for e in events}
        assert len(rows) == len(ed.select_events(events, seed=0, note_id="n1")) >= 4
        assert len({r["edit_start"] for r in rows}) > 1  # several edit points: the cache is revisited
        effects, mediated = [], []
        for row in rows:
            e = by_pos[row["pos"]]
            s, t = row["edit_start"], row["edit_end"]
            assert abs(row["margin_identity"] - _brute_margin(qwen_model, hook, note.ids, e)) < TOL
            assert abs(row["margin_identity_ablated"] - _brute_margin(qwen_model, hook, note.ids, e, pre.mu)) < TOL
            variants = ed.prefix_variants(note, e, codes=list(INVENTORY), tokenizer=tokenizer,
                                          filler_id=settings.filler_id, seed=0)
            for kind in ed.PREFIX_VARIANTS:
                v = variants[kind]
                assert row["replacement"][kind] == v.replacement
                seq = note.ids[:s] + v.span_ids + note.ids[t:]
                assert abs(row["margin"][kind] - _brute_margin(qwen_model, hook, seq, e)) < TOL
                assert abs(row["margin_ablated"][kind] - _brute_margin(qwen_model, hook, seq, e, pre.mu)) < TOL
                effects.append(row["margin_identity"] - row["margin"][kind])
                mediated.append(row["margin_ablated"][kind] - row["margin"][kind])
        # every edit moves the margin far beyond the tolerance (a re-feed blind to the edit would fail)
        assert min(abs(x) for x in effects) > 20 * TOL and max(abs(x) for x in effects) > 1e-2
        assert max(abs(x) for x in mediated) > 1e-2  # and the mediation heads matter
    finally:
        hook.remove()


@pytest.mark.parametrize("pack_tokens", [1, 40, 4096])
def test_prefix_edits_packed_in_place_or_both_agree(qwen_model, tokenizer, world, pack_tokens):
    """Packs of every size give the margins of one variant per forward (pack_tokens=1: every variant
    re-fed in place; 40: some packed, the longer ones in place), to 1e-5; packed re-feeds leave the
    prefill's keys as they were."""
    note, events = world
    settings = _settings(tokenizer)
    hook = HeadHook(qwen_model)
    try:
        one_by_one = ed.prefix_edit_note(qwen_model, hook, prefill(qwen_model, hook, note.ids, reserve=4096), note,
                                         events, codes=list(INVENTORY), tokenizer=tokenizer, settings=settings,
                                         pack_tokens=1)
        pre = prefill(qwen_model, hook, note.ids, reserve=4096)
        keys = [layer.keys[..., :pre.length, :].clone() for layer in pre.cache.layers]
        rows = ed.prefix_edit_note(qwen_model, hook, pre, note, events, codes=list(INVENTORY), tokenizer=tokenizer,
                                   settings=settings, pack_tokens=pack_tokens)
        values = lambda rs: [v for r in rs for v in (r["margin_identity"], r["margin_identity_ablated"],
                                                      *r["margin"].values(), *r["margin_ablated"].values())]
        assert torch.allclose(torch.tensor(values(rows)), torch.tensor(values(one_by_one)), atol=TOL, rtol=0)
        widths = [r["pos"] - 1 - r["edit_start"] + 2 for r in rows]   # a variant's tokens and its two reads
        in_place = pre.cache.get_seq_length() < pre.length            # a variant re-fed in place crops the cache
        assert in_place == (max(widths) > pack_tokens)
        if pack_tokens == 40:
            assert min(widths) <= 40 < max(widths)   # packed and in-place re-feeds in one note
        if not in_place:  # the prefill's keys are intact
            assert all(torch.equal(layer.key_buffer[..., :pre.length, :], k) for layer, k in zip(pre.cache.layers, keys))
    finally:
        hook.remove()


def test_packs_and_their_mask_on_a_hand_worked_example():
    assert ed.packs([3, 2, 2, 4, 1], 5) == [[0, 1], [2], [3, 4]]
    assert ed.packs([], 5) == []
    # two re-feeds after a 4-token cache: tokens [a, b] from position 1 read at 3; token [c] from 2 read at 3
    refeeds = [ed.Refeed(1, [10, 11], 3, 12), ed.Refeed(2, [20], 3, 21)]
    mask = ed.packed_mask(refeeds, 2, 4, torch.float32, "cpu")[0, 0]
    seen = (mask == 0).int().tolist()
    #            cache 0-3    a  b  r  r' c  r  r'
    assert seen == [[1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0],   # a: cache [0, 1), itself
                    [1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0],   # b: cache [0, 1), a, itself
                    [1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0],   # read: cache [0, 1), a, b, itself
                    [1, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0],   # ablated read: the same, itself
                    [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0],   # c: cache [0, 2), itself
                    [1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0],
                    [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1]]


def test_content_words_on_hand_worked_descriptions():
    assert ed.content_words("acute hepatic failure with coma") == {"acute", "hepatic", "failure", "coma"}
    # "with" against "without": structural, and "coma" is in both: no distinguishing word either way
    assert ed.distinguishing_words("acute hepatic failure with coma", "acute hepatic failure without coma") == []
    assert ed.distinguishing_words("acute hepatic failure without coma", "acute hepatic failure with coma") == []
    assert ed.distinguishing_words(INVENTORY["E11.65"], INVENTORY["E11.9"]) == ["hyperglycemia"]
    assert ed.distinguishing_words(INVENTORY["E11.9"], INVENTORY["E11.65"]) == ["complications"]
    assert ed.distinguishing_words(INVENTORY["N18.3"], INVENTORY["N18.4"]) == []  # digits are not words
    assert ed.content_words("other specified disorders of the kidney and ureter") == {"kidney", "ureter"}
    left, right = "pressure ulcer of left heel stage 2", "pressure ulcer of right heel stage 2"
    assert ed.distinguishing_words(left, right) == ["left"]
    assert ed.distinguishing_words(left, right, {"right", "heel"}) == []  # "left" is not in the note


def test_note_words_and_their_classes(tokenizer, world):
    note, _ = world
    occ = ed.note_word_occurrences(note)
    start, end = ed.note_char_span(note)
    assert note.text[start:end].strip() == NOTE
    assert len(occ["hyperglycemia"]) == 2 and "with" not in occ and "man" not in occ
    # words of the header, the inventory lines and the instruction are not note words
    assert not {"discharge", "summary", "hypertension", "expert", "coder"} & set(occ)
    other_chapter, no_description = ed.control_pools(set(occ), INVENTORY, "E")
    assert "exacerbation" in other_chapter and "kidney" in other_chapter  # only in J / N descriptions
    assert "wheezing" in no_description and "copd" in no_description
    assert "hyperglycemia" not in other_chapter + no_description  # the code's own chapter
    assert "complications" not in other_chapter + no_description
    other_j, _ = ed.control_pools(set(occ), INVENTORY, "J")
    assert "exacerbation" not in other_j and "hyperglycemia" in other_j
    # token rule: every token of an occurrence, its leading space included, and nothing else
    toks = ed.word_tokens(note.offsets, occ["hyperglycemia"])
    text = "".join(note.text[note.offsets[j][0]:note.offsets[j][1]] for j in toks)
    assert text == " hyperglycemia hyperglycemia"


def test_evidence_edits_equal_brute_force(qwen_model, tokenizer, world):
    note, events = world
    settings = _settings(tokenizer)
    hook = HeadHook(qwen_model)
    try:
        pre = prefill(qwen_model, hook, note.ids)
        rows = ed.evidence_edit_note(qwen_model, hook, pre, note, events, inventory=INVENTORY, settings=settings)
        assert rows and {(r["code"], r["near_miss"]) for r in rows} == {("E11.65", "E11.9")}  # N18.x: no words
        occ = ed.note_word_occurrences(note)
        start, end = ed.note_char_span(note)
        by_pos = {e.pos: e for e in events}
        effects = []
        for row in rows:
            e = by_pos[row["pos"]]
            words = row["words"]
            assert words["evidence"] == ["hyperglycemia"] and words["sibling"] == ["complications"]
            assert len(words["other_chapter"]) == len(words["no_description"]) == 1
            assert ed.control_pools(set(occ), INVENTORY, "E")[0].count(words["other_chapter"][0]) == 1
            assert abs(row["margin_identity"] - _brute_margin(qwen_model, hook, note.ids, e)) < TOL
            for kind in ed.NOTE_VARIANTS:
                toks = ed.word_tokens(note.offsets, [span for w in words[kind] for span in occ[w]])
                assert toks and all(start - 1 <= note.offsets[j][0] and note.offsets[j][1] <= end for j in toks)
                seq = ed.edited_ids(note.ids, toks, settings.filler_id)
                assert len(seq) == len(note.ids)
                assert {j for j in range(len(seq)) if seq[j] != note.ids[j]} == set(toks)
                assert abs(row["margin"][kind] - _brute_margin(qwen_model, hook, seq, e)) < TOL
                effects.append(row["margin_identity"] - row["margin"][kind])
        assert min(abs(x) for x in effects) > 20 * TOL and max(abs(x) for x in effects) > 1e-2
        again = ed.evidence_edit_note(qwen_model, hook, prefill(qwen_model, hook, note.ids), note, events,
                                      inventory=INVENTORY, settings=settings)
        assert [r["words"] for r in again] == [r["words"] for r in rows]  # seeded draws are stable
    finally:
        hook.remove()


def test_near_miss_spans_found_from_the_text_equal_the_extractor(world, tokenizer):
    """A student's realised events carry no N spans; the text-found spans are the extractor's own."""
    note, events = world[0], world[1]
    p2c = [e for e in events if e.kind == "P2C"]
    assert p2c
    for e in p2c:
        assert ed.near_miss_spans(note, e) == e.n_pos
    stripped = [dataclasses.replace(e, n_pos=None) for e in events]
    assert [e.n_pos for e in ed.with_near_miss_spans(note, stripped) if e.kind == "P2C"] == [e.n_pos for e in p2c]
