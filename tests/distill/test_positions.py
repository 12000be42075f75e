"""RandPos (App. M.1): events moved to random completion positions, and teacher targets computed there."""

import numpy as np
import pytest
import torch

from mistill.distill import buckets as bk
from mistill.distill import pools as pl
from mistill.distill import targets as tg
from mistill.distill.alignment import KINDS
from mistill.distill.mechanism import note_view
from mistill.distill.positions import relocate_events
from mistill.errors import UserError
from mistill.io import write_jsonl
from mistill.models.tokenizers import qwen3_tokenizer
from tests.distill.test_training import _head_sets, _model, _tok

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def world(note_prompt, completion, events):
    tok = _tok(qwen3_tokenizer(), note_prompt, completion)
    return {"tok": tok, "prompt": note_prompt, "completion": completion, "events": events,
            "competitors": tg.competitor_strings(tok, events)}


def _move(world, seed, note_id="n1"):
    return relocate_events(world["events"], world["competitors"], world["tok"], world["prompt"], world["completion"],
                           position_seed=seed, note_id=note_id)


def _view(world, events):
    axis = bk.build_axis(world["prompt"], world["completion"])
    return note_view(world["tok"], axis, events, tg.competitor_strings(world["tok"], events))


def test_moved_events_keep_kinds_and_codes_and_leave_every_event_token(world):
    moved = _move(world, seed=0)
    view = _view(world, world["events"])
    original = {ev.row + 1 for ev in view.realized}
    assert [e["kind"] for e in moved] == [e["kind"] for e in world["events"]]     # every event placed here
    assert [e["code"] for e in moved] == [e["code"] for e in world["events"]]
    positions = [e["pos"] for e in moved]
    assert len(set(positions)) == len(positions)                                  # without replacement
    assert not set(positions) & original
    assert all(p >= view.completion_token for p in positions)
    # the teacher's own tokenization realises every moved event at its position, with its own token as target
    realized = _view(world, moved).realized
    assert len(realized) == len(moved)
    assert all(moved[ev.index]["pos"] == ev.row + 1 and moved[ev.index]["target_id"] == ev.target_id
               for ev in realized)
    assert all(e["prefix"] == "" for e in moved)


def test_positions_depend_on_the_seed_and_note_only(world):
    first, again = _move(world, seed=0), _move(world, seed=0)
    assert first == again
    assert [e["pos"] for e in _move(world, seed=1)] != [e["pos"] for e in first]
    assert [e["pos"] for e in _move(world, seed=0, note_id="n2")] != [e["pos"] for e in first]


def test_null_events_stay_where_they_are(world):
    null = {"kind": "NULL", "pos": 5, "target_id": 7, "competitor_ids": [8], "anchor": 3}
    events = world["events"] + [null]
    moved = relocate_events(events, tg.competitor_strings(world["tok"], events), world["tok"], world["prompt"],
                            world["completion"], position_seed=0, note_id="n1")
    assert moved[-1] == null and set(KINDS) == {e["kind"] for e in moved[:-1]}


def test_random_position_targets_sit_at_the_moved_rows(world, tmp_path):
    teacher = _model(world["tok"], seed=1, layers=3)
    write_jsonl(tmp_path / "events" / "n1" / "events.jsonl", world["events"])
    traces = [{"note_id": "n1", "prompt": world["prompt"], "completion": world["completion"], "valid": True}]
    hs = _head_sets(3, 4, 0)
    kwargs = dict(window=8, topk=8, teacher_id="tiny-teacher", provenance={})
    at_events = tg.compute_targets(teacher, world["tok"], traces, tmp_path / "events", tmp_path / "ev",
                                   pl.build_pools(hs, 6), pl.build_pool(hs, "prose", 6), **kwargs)
    manifest = tg.compute_targets(teacher, world["tok"], traces, tmp_path / "events", tmp_path / "rp",
                                  pl.build_pools(hs, 6), pl.build_pool(hs, "prose", 6), positions="random",
                                  position_seed=3, **kwargs)
    assert manifest["positions"] == {"rule": "random", "seed": 3} and "positions" not in at_events
    meta, arrays = tg.read_note_targets(tmp_path / "rp" / "n1.npz")
    moved = _move(world, seed=3)
    assert [e["pos"] for e in meta["events"]] == [e["pos"] for e in moved]
    _, original = tg.read_note_targets(tmp_path / "ev" / "n1.npz")
    for phase in ("P1", "P2", "P2C"):
        assert arrays[f"{phase}_rows"].shape == original[f"{phase}_rows"].shape   # each kind keeps its row count
        assert not np.allclose(arrays[f"{phase}_rows"], original[f"{phase}_rows"])
    # the top-k next-token targets do not depend on where the events sit
    np.testing.assert_array_equal(arrays["top_ids"], original["top_ids"])
    # a stored file of the other rule is recomputed, not reused
    assert tg.stored_key(tmp_path / "rp" / "n1.npz") != tg.stored_key(tmp_path / "ev" / "n1.npz")
    with pytest.raises(UserError, match="position rule"):
        tg.compute_targets(teacher, world["tok"], traces, tmp_path / "events", tmp_path / "x", pl.build_pools(hs, 6),
                           None, positions="elsewhere", **{**kwargs, "window": 0})
