"""The mechanism terms' diagnostic pass (mistill.distill.diagnostics): the trainer's terms, read without an update,
and the student-teacher correlation of c, checked where the answer is known."""

import numpy as np
import pytest
import torch

from mistill.distill import arms
from mistill.distill import objective as obj
from mistill.distill import pools as pl
from mistill.distill import targets as tg
from mistill.distill.diagnostics import c_correlation, measure_terms, write_drop_percent
from mistill.distill.mechanism import supervised_layers
from mistill.distill.pooled_attention import SupervisedRows
from tests.distill.conftest import NOTE_TEXT
from tests.distill.test_training import _head_sets, _model, targets_world

torch.set_num_threads(1)

NOTES = {"short": " ".join(NOTE_TEXT.split()[:40]), "mid": NOTE_TEXT}


def _same_sets(n_layers, n_heads, seed):
    """Head sets whose prose ranking is P1's: the window rows then read the P1 pool on both sides, as a student's do."""
    sets = _head_sets(n_layers, n_heads, seed)
    sets["phases"]["prose"] = sets["phases"]["P1"]
    return sets


@pytest.fixture(scope="module")
def world(tmp_path_factory, completion, events):
    """Targets of a tiny teacher on two notes, and the pools they were computed with."""
    tmp_path = tmp_path_factory.mktemp("diagnostics")
    sets = _same_sets(2, 4, 0)
    tok, teacher, _, manifest = targets_world(tmp_path, NOTES, completion, events, layers=2, head_sets=sets, k=5)
    pools = pl.build_pools(sets, 5)
    arm = arms.ArmConfig(arm="mistill", terms=("attn", "inter", "write"))
    notes = []
    for note_id in manifest["notes"]:
        meta, arrays = tg.read_note_targets(tmp_path / "targets" / f"{note_id}.npz")
        notes.append(arms.prepare_note(meta, arrays, tok, tok, arm))
    return {"tok": tok, "teacher": teacher, "notes": notes, "pools": pools}


def test_the_teacher_read_as_its_own_student_matches_itself(world):
    """The targets pass and the trainer's rows hook are two implementations of the pooled rows and of c: the teacher
    read as a student, with the pools its targets were computed with, has c^S = c^T at every event (r = 1) and
    every term at zero."""
    out = measure_terms(world["teacher"], world["notes"], world["pools"], window=8, write_norm=False,
                        autocast_bf16=False)
    assert any(out[p]["events"] > 2 for p in obj.PHASES)
    for phase in obj.PHASES:
        if out[phase]["events"] < 3:
            continue
        assert out[phase]["c_correlation"] == pytest.approx(1.0, abs=1e-6)
        for name, value in out[phase]["terms"].items():
            assert value == pytest.approx(0.0, abs=1e-5), (phase, name)


@pytest.mark.parametrize("write_norm", [False, True])
def test_the_terms_are_the_trainers_on_each_note(world, write_norm):
    """A student's terms per phase are the mean over the notes of what the trainer's loss logs for each note."""
    student = _model(world["tok"], seed=3, layers=2)
    pools = pl.build_pools(_same_sets(2, 4, 5), 5)
    arm = arms.ArmConfig(arm="mistill", terms=("attn", "inter", "write"), write_norm=write_norm, window=8)
    hook = SupervisedRows(student, supervised_layers(pools, pools["P1"]), row_chunk=arm.row_chunk)
    with torch.no_grad():
        logs = [arms.notes_loss(student, [note], arm, pools, hook)[0][1] for note in world["notes"]]
    hook.remove()
    out = measure_terms(student, world["notes"], pools, window=8, write_norm=write_norm, autocast_bf16=False)
    for phase in obj.PHASES:
        for name in ("attn", "inter", "write"):
            logged = [log[f"{phase}_{name}"] for log in logs if f"{phase}_{name}" in log]
            if logged:
                assert out[phase]["terms"][name] == pytest.approx(np.mean(logged), rel=1e-6, abs=1e-9)
    raw = measure_terms(student, world["notes"], pools, window=8, write_norm=not write_norm, autocast_bf16=False)
    # the form changes the write term, never the correlation of the contributions themselves
    assert raw["P1"]["c_correlation"] == pytest.approx(out["P1"]["c_correlation"], abs=1e-12)


def test_c_correlation_is_pearsons_r_and_undefined_on_a_constant_side():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=20), rng.normal(size=20)
    assert c_correlation(a, b) == pytest.approx(np.corrcoef(a, b)[0, 1], abs=1e-12)
    assert c_correlation(a, 3 * a + 1) == pytest.approx(1.0)
    assert c_correlation(a, np.full(20, 0.5)) is None and c_correlation(a[:2], b[:2]) is None


def test_write_drop_is_the_percent_decrease():
    before = {"P1": {"terms": {"write": 2.0}}}
    after = {"P1": {"terms": {"write": 0.14}}}
    assert write_drop_percent(before, after) == pytest.approx(93.0)     # App. I.2's 93%
    assert write_drop_percent(after, before) == pytest.approx(100 * (1 - 2.0 / 0.14))
