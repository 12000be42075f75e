"""`mistill distill targets | train` and `mistill evaluate task | m1` end to end on saved tiny models."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from mistill.cli import main
from mistill.io import write_json, write_jsonl
from mistill.models.architectures import TinyArchitecture, build_model
from mistill.models.tokenizers import CompactTokenizer, build_remap, qwen3_tokenizer


def _save_model(path, tok, seed, layers):
    arch = TinyArchitecture(family="qwen3", hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = build_model(arch, vocab_size=tok.vocab_size, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id, seed=seed)
    model.save_pretrained(path)
    tok.save(path)


def _head_sets(path, n_layers, n_heads, phases=("P1", "P2", "P2C"), seed=0):
    rng = np.random.default_rng(seed)
    phases = {p: [{"layer": int(i // n_heads), "head": int(i % n_heads), "ic": float(v), "weight": None}
                  for i, v in zip(rng.permutation(n_layers * n_heads), np.linspace(1, -1, n_layers * n_heads))]
              for p in phases}
    write_json(path, {"n_layers": n_layers, "n_heads": n_heads, "phases": phases, "tau": {}, "provenance": {}})


@pytest.fixture
def project(tmp_path, monkeypatch, note_prompt, completion, events):
    base = qwen3_tokenizer()
    tok = CompactTokenizer(base, build_remap(base, [base.chat_prompt(note_prompt) + completion]))
    _save_model(tmp_path / "teacher", tok, 1, 2)
    _save_model(tmp_path / "student", tok, 2, 2)
    notes = [{"note_id": n, "patient_id": n, "text": "word", "gold_codes": ["N18.9"], "split": "train"}
             for n in ("a", "b")]
    write_jsonl(tmp_path / "train.jsonl", notes)
    write_jsonl(tmp_path / "traces.jsonl", [{"note_id": n, "prompt": note_prompt, "completion": completion,
                                             "valid": True, "answer": ["N18.9"]} for n in ("a", "b")])
    for n in ("a", "b"):
        write_jsonl(tmp_path / "events" / n / "events.jsonl", events)
    _head_sets(tmp_path / "t_sets.json", 2, 4)
    _head_sets(tmp_path / "locus_sets.json", 2, 4, phases=("prose", "suffix"), seed=5)   # the locus pass's file
    _head_sets(tmp_path / "s_sets.json", 2, 4)
    params = {"profile": "demo", "demo": {
        "models": {"teacher": str(tmp_path / "teacher"), "student_qwen": str(tmp_path / "student")},
        "distill": {"traces": "traces.jsonl", "train_notes": "train.jsonl", "events_dir": "events",
                    "teacher_head_sets": "t_sets.json", "teacher_prose_sets": "locus_sets.json",
                    "student_head_sets": {"student_qwen": "s_sets.json"},
                    "targets_dir": "targets", "runs_dir": "runs", "pool_k": {"teacher": 3, "student": 3},
                    "window": 8, "topk": 8, "lambda_p1": 0.1, "lambda_p2": 0.1, "terms": ["attn", "inter"],
                    "write_norm": False, "heads": "top", "pool_seed": 0,
                    "precision": {"vanilla": "fp32", "mistill": "bf16"}, "seeds": [0],
                    "train": {"epochs": 1, "batch": 2, "lr": 0.001, "warmup_frac": 0.05, "clip": 1.0,
                              "gradient_checkpointing": False}},
        "evaluate": {"test_notes": "train.jsonl", "train_notes": "train.jsonl", "teacher_traces": "traces.jsonl",
                     "events_dir": "events", "ks": [8, 15], "psp_a": 0.55, "psp_b": 1.5}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_targets_train_and_evaluate(project, capsys):
    assert main(["distill", "targets"]) == 0
    manifest = json.loads((project / "targets" / "manifest.json").read_text())
    assert manifest["notes"] == ["a", "b"] and len(manifest["teacher_hash"]) == 64
    assert main(["distill", "coverage", "--students", "student_qwen", "--out", "coverage.json"]) == 0
    cov = json.loads((project / "coverage.json").read_text())["coverage"]["student_qwen"]
    assert cov["P1"]["share"] == 1.0 and cov["P2"]["realized"] == 12 and cov["notes"] == 2
    for arm in ("vanilla", "mistill"):
        assert main(["distill", "train", "--arm", arm]) == 0
    runs = sorted(p.name for p in (project / "runs").glob("DT-00*/*"))
    assert runs == ["student-qwen-mistill-bf16-s0", "student-qwen-vanilla-fp32-s0"]   # mistill.distill.runs
    run = project / "runs" / "DT-001" / "student-qwen-mistill-bf16-s0"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["arm"]["lambda_p1"] == 0.1 and cfg["example_ids"] == ["a", "b"] and cfg["torch_version"]
    assert (run / "model" / "config.json").exists()
    assert main(["evaluate", "task", "--generations", "traces.jsonl", "--out", "task.json"]) == 0
    assert json.loads((project / "task.json").read_text())["metrics"]["micro_f1"] == 1.0
    assert main(["evaluate", "m1", "--model", str(run / "model"), "--threads", "1", "--out", "m1.json"]) == 0
    m1 = json.loads((project / "m1.json").read_text())["m1"]
    assert m1["P1"]["events"] == 4 and 0.0 <= m1["P2C"]["p_margin_positive"] <= 1.0


def test_window_rows_are_pooled_over_the_locus_pass_prose_ranking(project, capsys):
    """The window rows' teacher pool is the top-k of the prose ranking in distill.teacher_prose_sets (the
    locus pass's file), not anything in the emission head sets; without that file a window is refused."""
    assert main(["distill", "targets"]) == 0
    manifest = json.loads((project / "targets" / "manifest.json").read_text())
    prose = json.loads((project / "locus_sets.json").read_text())["phases"]["prose"][:3]
    assert manifest["prose_pool"]["heads"] == [[r["layer"], r["head"]] for r in prose]
    assert manifest["window"] == 8
    (project / "locus_sets.json").unlink()
    assert main(["distill", "targets", "--out", "targets2"]) == 2
    assert "no prose-time head sets" in capsys.readouterr().err


def test_a_recipe_variant_trains_its_switches_under_the_variants_directory(project):
    """`--variant nowindow` takes student, seed, precision and window from params variants.arms and
    writes its run where mistill.distill.runs.variant_run_dir says; the main runs' directory stays empty."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["demo"]["variants"] = {"dir": "variants", "arms": {
        "nowindow": {"student": "qwen", "seed": 3, "precision": "bf16", "window": 0}}}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["distill", "targets"]) == 0
    assert main(["distill", "train", "--arm", "mistill", "--variant", "nowindow"]) == 0
    run = project / "variants" / "DT-001" / "student-qwen-nowindow-bf16-s3"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["arm"]["window"] == 0 and cfg["train"]["seed"] == 3 and cfg["train"]["precision"] == "bf16"
    assert not (project / "runs").exists()
    # --out moves the run, never its switches
    assert main(["distill", "train", "--variant", "nowindow", "--out", "elsewhere", "--max-steps", "1"]) == 0
    moved = json.loads((project / "elsewhere" / "config.json").read_text())
    assert moved["arm"]["window"] == 0 and moved["train"]["seed"] == 3


def test_a_learning_curve_variant_trains_on_its_subset_of_the_notes(project):
    """`n_train` (App. M.5): the variant trains on that many of the targets' notes, the subset
    `mistill.distill.subsets.training_subset` names, and a Vanilla CoT-KD variant on the same ones."""
    from mistill.distill.subsets import training_subset

    params = yaml.safe_load((project / "params.yaml").read_text())
    params["demo"]["variants"] = {"dir": "variants", "arms": {
        "mistilln1": {"student": "qwen", "seed": 0, "precision": "bf16", "n_train": 1},
        "vanillan1": {"arm": "vanilla", "student": "qwen", "seed": 0, "precision": "bf16", "n_train": 1}}}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["distill", "targets"]) == 0
    for name in ("mistilln1", "vanillan1"):
        assert main(["distill", "train", "--variant", name]) == 0
    configs = [json.loads((project / "variants" / "DT-001" / f"student-qwen-{n}-bf16-s0" / "config.json").read_text())
               for n in ("mistilln1", "vanillan1")]
    assert [c["example_ids"] for c in configs] == [training_subset(["a", "b"], 1)] * 2
    assert configs[0]["total_steps"] == 1 and configs[1]["arm"]["arm"] == "vanilla"


def test_a_randpos_variant_trains_on_its_own_targets_at_moved_positions(project):
    """`positions: random` (RandPos, App. M.1): the run computes its own targets inside its directory, on the
    notes of the event targets, with the events moved by its training seed; the event targets stay as they were."""
    from mistill.distill.targets import read_note_targets

    params = yaml.safe_load((project / "params.yaml").read_text())
    params["demo"]["variants"] = {"dir": "variants", "arms": {
        "randpos": {"student": "qwen", "seed": 2, "precision": "bf16", "positions": "random"}}}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["distill", "targets"]) == 0
    before = {p.name: p.read_bytes() for p in (project / "targets").iterdir()}
    assert main(["distill", "train", "--arm", "mistill", "--variant", "randpos"]) == 0
    run = project / "variants" / "DT-001" / "student-qwen-randpos-bf16-s2"
    manifest = json.loads((run / "targets" / "manifest.json").read_text())
    assert manifest["positions"] == {"rule": "random", "seed": 2} and manifest["notes"] == ["a", "b"]
    moved, _ = read_note_targets(run / "targets" / "a.npz")
    events, _ = read_note_targets(project / "targets" / "a.npz")
    assert [e["kind"] for e in moved["events"]] == [e["kind"] for e in events["events"]]
    assert all(e["moved_from"] == o["pos"] and e["pos"] != o["pos"]
               for e, o in zip(moved["events"], events["events"]))
    assert json.loads((run / "config.json").read_text())["targets"] == str(run.relative_to(project) / "targets")
    assert {p.name: p.read_bytes() for p in (project / "targets").iterdir()} == before


def test_an_event_weighted_vanilla_variant_logs_the_loss_its_weights_add(project, capsys):
    """`arm: vanilla, event_weight: 4` (evw4, App. M.1) trains Vanilla CoT-KD with its token loss up-weighted at
    the teacher's events; the log carries what the weights add; a variant's objective is its own."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["demo"]["variants"] = {"dir": "variants", "arms": {
        "evw4": {"arm": "vanilla", "student": "qwen", "seed": 0, "precision": "fp32", "event_weight": 4}}}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["distill", "targets"]) == 0
    assert main(["distill", "train", "--arm", "mistill", "--variant", "evw4"]) == 2
    assert "trains the vanilla objective" in capsys.readouterr().err
    assert main(["distill", "train", "--variant", "evw4"]) == 0
    run = project / "variants" / "DT-001" / "student-qwen-evw4-fp32-s0"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["arm"]["arm"] == "vanilla" and cfg["arm"]["event_weight"] == 4.0 and cfg["pools"] == {}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["event_extra"] > 0
    assert main(["distill", "train", "--arm", "vanilla"]) == 0
    plain = json.loads((project / "runs" / "DT-000" / "student-qwen-vanilla-fp32-s0" / "config.json").read_text())
    assert "event_weight" not in plain["arm"]
    assert main(["distill", "train"]) == 2 and "--arm" in capsys.readouterr().err


def test_a_dose_matched_variant_starts_with_mistills_extra_loss(project):
    """`dose: match` (App. M.1): a variant equal to Mistill gets Mistill's own λ back; the uniform-heads,
    attention-only variant gets the λ at which its first step adds exactly Mistill's first-step extra loss."""
    from mistill.distill.dose import first_step_extra

    params = yaml.safe_load((project / "params.yaml").read_text())
    params["demo"]["variants"] = {"dir": "variants", "arms": {
        "same": {"student": "qwen", "seed": 0, "precision": "bf16", "dose": "match"},
        "uniform": {"student": "qwen", "seed": 0, "precision": "bf16", "heads": "uniform", "terms": ["attn"],
                    "dose": "match"}}}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["distill", "targets"]) == 0
    assert main(["distill", "train", "--arm", "mistill", "--variant", "same"]) == 2   # no Mistill run yet
    assert main(["distill", "train", "--arm", "mistill"]) == 0
    mistill_extra = first_step_extra(project / "runs" / "DT-001" / "student-qwen-mistill-bf16-s0")
    for name in ("same", "uniform"):
        assert main(["distill", "train", "--arm", "mistill", "--variant", name]) == 0
    run = project / "variants" / "DT-001"
    same = json.loads((run / "student-qwen-same-bf16-s0" / "config.json").read_text())
    assert same["arm"]["lambda_p1"] == same["arm"]["lambda_p2"] == pytest.approx(0.1, rel=1e-12)
    uniform = json.loads((run / "student-qwen-uniform-bf16-s0" / "config.json").read_text())
    assert uniform["dose"]["reference_extra"] == mistill_extra
    assert uniform["arm"]["lambda_p1"] != pytest.approx(0.1)
    assert first_step_extra(run / "student-qwen-uniform-bf16-s0") == pytest.approx(mistill_extra, rel=1e-9)


@pytest.mark.parametrize("entry, message", [
    ({"student": "qwen", "seed": 0, "precision": "bf16", "windw": 0}, "unknown switches windw"),
    ({"student": "qwen", "precision": "bf16"}, "missing seed"),
])
def test_a_malformed_variant_is_refused_by_name(project, capsys, entry, message):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["demo"]["variants"] = {"dir": "variants", "arms": {"v": entry}}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["distill", "train", "--arm", "mistill", "--variant", "v"]) == 2
    assert message in capsys.readouterr().err
    assert main(["distill", "train", "--arm", "mistill", "--variant", "other"]) == 2
    assert "unknown recipe variant 'other'" in capsys.readouterr().err


def test_targets_from_another_teacher_are_refused(project, capsys):
    assert main(["distill", "targets"]) == 0
    _save_model(project / "other", CompactTokenizer.load(project / "teacher"), 7, 2)
    code = main(["distill", "train", "--arm", "vanilla", "--teacher", str(project / "other")])
    assert code == 2
    assert "not from" in capsys.readouterr().err
    assert not (project / "runs").exists()  # nothing trained


def test_trace_without_events_is_refused(project, capsys):
    write_jsonl(project / "events" / "b" / "events.jsonl", [])
    assert main(["distill", "targets"]) == 2
    assert "no P1/P2/P2C events" in capsys.readouterr().err
    assert not (project / "targets" / "manifest.json").exists()


def _select_from(project, lambdas: tuple[float, float]) -> None:
    """params distill.lambda_from naming grid g, whose pick (as DT-select@g writes it) is `lambdas`."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    for key in ("lambda_p1", "lambda_p2"):
        del params["demo"]["distill"][key]
    params["demo"]["distill"]["lambda_from"] = "g"
    params["demo"]["selection"] = {"dir": "select", "grids": {}}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    write_json(project / "select" / "picks" / "g.json", {"selected": {"lambda_p1": lambdas[0], "lambda_p2": lambdas[1]}})


def test_mistill_runs_train_with_the_selected_lambda(project, capsys):
    """Issue of the grid: the λ the selection stage picks is what `distill train` gives the Mistill objective
    (and what a variant that changes one weight keeps of the other); Vanilla CoT-KD's record is untouched."""
    _select_from(project, (0.37, 0.37))
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["demo"]["variants"] = {"dir": "variants", "arms": {
        "p1only": {"student": "qwen", "seed": 0, "precision": "bf16", "lambda_p2": 0.0},
        "ownpick": {"student": "qwen", "seed": 0, "precision": "bf16", "heads": "random", "lambda_from": "h"}}}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    write_json(project / "select" / "picks" / "h.json", {"selected": {"lambda_p1": 3.0, "lambda_p2": 3.0}})
    assert main(["distill", "targets"]) == 0
    for argv in (["--arm", "mistill"], ["--variant", "p1only"], ["--variant", "ownpick"], ["--arm", "vanilla"]):
        assert main(["distill", "train", *argv]) == 0
    arm = {name: json.loads((project / path / "config.json").read_text())["arm"] for name, path in (
        ("mistill", "runs/DT-001/student-qwen-mistill-bf16-s0"), ("p1only", "variants/DT-001/student-qwen-p1only-bf16-s0"),
        ("ownpick", "variants/DT-001/student-qwen-ownpick-bf16-s0"), ("vanilla", "runs/DT-000/student-qwen-vanilla-fp32-s0"))}
    assert (arm["mistill"]["lambda_p1"], arm["mistill"]["lambda_p2"]) == (0.37, 0.37)
    assert (arm["p1only"]["lambda_p1"], arm["p1only"]["lambda_p2"]) == (0.37, 0.0)
    assert (arm["ownpick"]["lambda_p1"], arm["ownpick"]["lambda_p2"]) == (3.0, 3.0)   # its own grid's pick (App. M.2)
    assert arm["vanilla"]["lambda_p1"] == 0.1   # the dataclass default: Vanilla has no mechanism terms

    (project / "select" / "picks" / "g.json").unlink()
    assert main(["distill", "train", "--arm", "mistill", "--seed", "1"]) == 2
    assert "no λ selection (run `dvc repro pipelines/distill/dvc.yaml:DT-select@g`)" in capsys.readouterr().err
    params["demo"]["distill"]["lambda_p1"] = 0.1
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["distill", "train", "--arm", "mistill", "--seed", "1"]) == 2
    assert "not both" in capsys.readouterr().err


def test_select_applies_the_rule_and_takes_one_outward_step(project, monkeypatch):
    """`distill select`: the cells' readouts through the rule of mistill.distill.selection, one outward step when
    the pick sits on the grid's edge, and the pick written where the runs read it."""
    from mistill.distill import selection_commands
    from mistill.distill.selection import Cell

    readouts = {0.3: (0.40, 0.90), 1.0: (0.35, 0.95), 3.0: (0.30, 0.99), 0.1: (0.398, 0.97)}
    trained = []

    def fake_cell(params, parser, name, entry, lam, grid_dir, validation):
        trained.append(lam)
        return Cell(lam, *readouts[lam])

    monkeypatch.setattr(selection_commands, "run_cell", fake_cell)
    _select_from(project, (0.1, 0.1))
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["demo"]["selection"] = {"dir": "select", "notes": "train.jsonl", "traces": "traces.jsonl",
                                   "events_dir": "events", "grids": {"g": {
                                       "student": "qwen", "seed": 0, "precision": "bf16", "lambdas": [1, 0.3, 3],
                                       "band": 0.004, "extend": True, "heads": "random"}}}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["distill", "select", "--grid", "g"]) == 0
    chosen = json.loads((project / "select" / "picks" / "g.json").read_text())
    assert trained == [0.3, 1.0, 3.0, 0.1]     # 0.3 on the edge: one step down the series
    assert chosen["tied"] == [0.1, 0.3] and chosen["selected"] == {"lambda_p1": 0.1, "lambda_p2": 0.1}
    assert chosen["outward_step"] == 0.1 and [c["lambda"] for c in chosen["cells"]] == [0.1, 0.3, 1.0, 3.0]
    assert (project / "select" / "g" / "m1_notes.jsonl").read_text().count("note_id") == 2

    from mistill.params import load_params

    spec = selection_commands.cell_spec(load_params(), params["demo"]["selection"]["grids"]["g"], 0.3, project / "run")
    assert spec.arm == "mistill" and spec.lambdas == (0.3, 0.3) and spec.out == project / "run"
    assert spec.heads == "random"   # a grid's recipe switch reaches its cells
    for reserved in ("picks", "reference"):   # directories of selection.dir cannot name a grid
        params["demo"]["selection"]["grids"][reserved] = params["demo"]["selection"]["grids"]["g"]
        (project / "params.yaml").write_text(yaml.safe_dump(params))
        assert main(["distill", "select", "--grid", reserved]) == 2
        del params["demo"]["selection"]["grids"][reserved]
    params["demo"]["selection"]["grids"]["g"]["dose"] = "match"
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["distill", "select", "--grid", "g"]) == 2


def test_a_variant_of_the_main_recipe_takes_the_main_run_unless_it_is_a_replicate(project, capsys):
    """A variant entry that resolves to the main Mistill run's recipe is that run (its files copied, the run it
    came from in its config); one with `retrain: true` (a replicate) is trained again, to the same weights on
    one machine."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["demo"]["variants"] = {"dir": "variants", "arms": {
        "same": {"student": "qwen", "seed": 0, "precision": "bf16"},
        "again": {"student": "qwen", "seed": 0, "precision": "bf16", "retrain": True}}}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["distill", "targets"]) == 0
    assert main(["distill", "train", "--arm", "mistill"]) == 0
    for name in ("same", "again"):
        assert main(["distill", "train", "--variant", name]) == 0
    main_run = Path("runs") / "DT-001" / "student-qwen-mistill-bf16-s0"
    runs = {name: project / "variants" / "DT-001" / f"student-qwen-{name}-bf16-s0" for name in ("same", "again")}
    configs = {name: json.loads((run / "config.json").read_text()) for name, run in runs.items()}
    assert configs["same"]["same_run_as"] == str(main_run) and "same_run_as" not in configs["again"]
    weights = {name: (run / "model" / "model.safetensors").read_bytes() for name, run in runs.items()}
    assert weights["same"] == weights["again"] == (project / main_run / "model" / "model.safetensors").read_bytes()


def test_a_selection_cell_is_reused_only_for_the_weights_its_readout_names(tmp_path, monkeypatch):
    """`run_cell` hands the run to the trainer every time (which restarts it when the recipe changed) and reuses
    the kept readout only while the weights are the ones it was computed on; new weights are evaluated again."""
    from types import SimpleNamespace

    from mistill.distill import selection_commands

    cell_dir = tmp_path / "g" / "l1"
    weights = cell_dir / "run" / "model" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"first weights")
    trained, evaluated = [], []

    def fake_train(params, spec):
        trained.append(spec)
        if params.get("retrain"):
            weights.write_bytes(b"weights of a changed recipe")

    def evaluate(args):
        evaluated.append(args)
        write_json(cell_dir / "task.json", {"metrics": {"micro_f1": 0.5 + len(evaluated) / 10}})
        write_json(cell_dir / "m1.json", {"m1": {"P2C": {"p_margin_positive": 0.9}}})
        return 0

    parser = SimpleNamespace(parse_args=lambda step: SimpleNamespace(func=evaluate))
    monkeypatch.setattr(selection_commands, "train_run", fake_train)
    monkeypatch.setattr(selection_commands, "cell_spec", lambda params, entry, lam, run: run)
    validation = {"notes": "n", "traces": "t", "events_dir": "e", "m1_notes": "m"}
    run = lambda params: selection_commands.run_cell(params, parser, "g", {}, 1.0, tmp_path / "g", validation)  # noqa: E731

    assert run({}).micro_f1 == pytest.approx(0.6)                  # no readout yet: trained, evaluated
    assert run({}).micro_f1 == pytest.approx(0.6)                  # unchanged weights: the readout is reused
    assert len(trained) == 2 and len(evaluated) == 1
    assert run({"retrain": True}).micro_f1 == pytest.approx(0.7)   # the trainer retrained: evaluated again
    assert len(trained) == 3 and len(evaluated) == 2
