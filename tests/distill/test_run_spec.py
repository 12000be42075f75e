"""A run's options resolved once (mistill.distill.run_spec): an option given, then its variant, then params distill;
λ from what is given, the variant's or the recipe's selection grid, never twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mistill.distill.run_spec import RunSpec
from mistill.distill.selection_commands import cell_spec
from mistill.errors import UserError


@pytest.fixture
def params(tmp_path):
    picks = tmp_path / "select" / "picks"
    picks.mkdir(parents=True)
    for grid, lam in (("bf16", 0.1), ("fp32", 0.3)):
        (picks / f"{grid}.json").write_text(json.dumps({"selected": {"lambda_p1": lam, "lambda_p2": lam}}))
    return {
        "models": {"teacher": "models/teacher", "student_qwen": "models/qwen"},
        "selection": {"dir": str(tmp_path / "select")},
        "distill": {"precision": {"vanilla": "fp32", "mistill": "bf16"}, "seeds": [0, 1, 2], "runs_dir": "runs",
                    "terms": ["attn", "inter"], "write_norm": False, "window": 8, "heads": "top", "pool_seed": 0,
                    "pool_k": {"student": 4}, "targets_dir": "targets", "lambda_from": "bf16",
                    "student_head_sets": {"student_qwen": "hs/qwen.json"}},
        "variants": {"dir": "variants", "arms": {
            "fp32pick": {"student": "qwen", "seed": 1, "precision": "fp32", "lambda_from": "fp32"},
            "attnonly": {"student": "qwen", "seed": 0, "precision": "bf16", "terms": ["attn"], "k": 2},
            "evw4": {"arm": "vanilla", "student": "qwen", "seed": 0, "precision": "fp32", "event_weight": 4},
            "uniform": {"student": "qwen", "seed": 0, "precision": "bf16", "dose": "match"}}},
    }


def test_params_alone_give_the_main_runs(params):
    mistill = RunSpec.resolve(params, {"arm": "mistill"})
    assert (mistill.student, mistill.precision, mistill.seed) == ("student_qwen", "bf16", 0)
    assert mistill.out == Path("runs/DT-001/student-qwen-mistill-bf16-s0")
    assert mistill.lambdas == (0.1, 0.1)                   # distill.lambda_from's pick
    assert mistill.terms == ("attn", "inter") and mistill.k == 4 and mistill.head_sets == "hs/qwen.json"
    vanilla = RunSpec.resolve(params, {"arm": "vanilla", "seed": 2})
    assert vanilla.precision == "fp32" and vanilla.lambdas is None and vanilla.head_sets is None
    assert vanilla.out == Path("runs/DT-000/student-qwen-vanilla-fp32-s2")


def test_an_option_given_overrides_the_variant_which_overrides_params(params):
    spec = RunSpec.resolve(params, {"variant": "attnonly"})
    assert spec.terms == ("attn",) and spec.k == 2 and spec.window == 8      # its switches, params elsewhere
    assert spec.out == Path("variants/DT-001/student-qwen-attnonly-bf16-s0")
    spec = RunSpec.resolve(params, {"variant": "attnonly", "k": 3, "terms": "attn,inter", "out": "elsewhere"})
    assert spec.k == 3 and spec.terms == ("attn", "inter") and spec.out == Path("elsewhere")
    evw4 = RunSpec.resolve(params, {"variant": "evw4"})
    assert evw4.arm == "vanilla" and evw4.event_weight == 4.0 and evw4.lambdas is None
    with pytest.raises(UserError, match="trains the vanilla objective"):
        RunSpec.resolve(params, {"variant": "evw4", "arm": "mistill"})


def test_lambda_is_resolved_in_one_step(params):
    assert RunSpec.resolve(params, {"variant": "fp32pick"}).lambdas == (0.3, 0.3)   # the variant's grid
    assert RunSpec.resolve(params, {"arm": "mistill", "lambda_from": "fp32"}).lambdas == (0.3, 0.3)
    assert RunSpec.resolve(params, {"arm": "mistill", "lambda_p2": 0.0}).lambdas == (0.1, 0.0)   # p1 from the pick
    assert RunSpec.resolve(params, {"arm": "mistill", "lambda_p1": 1, "lambda_p2": 3}).lambdas == (1.0, 3.0)
    assert RunSpec.resolve(params, {"variant": "uniform"}).dose == "match"
    with pytest.raises(UserError, match="give neither"):
        RunSpec.resolve(params, {"variant": "uniform", "lambda_p1": 0.1})
    params["distill"]["lambda_p1"] = 0.5
    with pytest.raises(UserError, match="not both"):
        RunSpec.resolve(params, {"arm": "mistill"})
    del params["distill"]["lambda_from"]
    with pytest.raises(UserError, match="no loss weights"):
        RunSpec.resolve(params, {"arm": "mistill"})


def test_a_run_needs_an_objective_and_known_options(params):
    with pytest.raises(UserError, match="name the objective"):
        RunSpec.resolve(params, {})
    with pytest.raises(UserError, match="unknown options lamda"):
        RunSpec.resolve(params, {"arm": "mistill", "lamda": 1})


def test_a_grid_cell_is_a_mistill_run_at_its_lambda(params, tmp_path):
    entry = {"student": "qwen", "seed": 0, "precision": "fp32", "heads": "random", "pool_seed": 0}
    spec = cell_spec(params, entry, 0.1 * 3, tmp_path / "run")    # 0.30000000000000004: the cell is l0.3
    assert spec.lambdas == (0.3, 0.3) and spec.precision == "fp32" and spec.heads == "random"
    assert spec.out == tmp_path / "run"


def test_a_write_term_grid_trains_the_form_it_names_and_may_ask_for_diagnostics(params, tmp_path):
    """App. I.2's grids: `terms` and `write_norm` are switches of the cells' runs, `diagnose` an option of the grid;
    a key that is neither is refused."""
    from mistill.distill.selection_grids import grid_entry

    rule = {"student": "qwen", "seed": 0, "precision": "bf16", "lambdas": [0.1, 0.3, 1], "band": 0.004,
            "extend": False}
    selection = {"dir": str(tmp_path), "grids": {
        "writenorm": {**rule, "terms": ["attn", "inter", "write"], "write_norm": True, "diagnose": True},
        "typo": {**rule, "diagnosis": True}}}
    entry = grid_entry(selection, "writenorm")
    spec = cell_spec(params, entry, 1.0, tmp_path / "run")
    assert spec.terms == ("attn", "inter", "write") and spec.write_norm and spec.lambdas == (1.0, 1.0)
    assert not cell_spec(params, {**rule, "terms": ["attn", "inter", "write"]}, 1.0, tmp_path / "run").write_norm
    with pytest.raises(UserError, match="unknown keys diagnosis"):
        grid_entry(selection, "typo")
