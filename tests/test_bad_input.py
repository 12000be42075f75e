"""Bad input files give one-line errors that name the file and say what to do, never a traceback.

One test per kind of bad input a user can hand the pipeline, through the `mistill` CLI (what a DVC
stage runs) or the library function that reads the file.  Kinds covered elsewhere, not repeated here:

* malformed inventory line: tests/world/test_inventory.py::test_malformed_inventory_line_names_file_and_line,
  tests/world/test_commands.py::test_malformed_inventory_writes_no_notes (CLI);
* empty note / unknown gold code: tests/world/test_notes.py::test_note_without_text_is_a_user_error,
  ::test_gold_code_not_in_inventory_is_a_user_error, tests/world/test_commands.py::
  test_gold_code_outside_inventory_writes_no_corpora (CLI);
* unknown model id / missing weights: tests/models/test_loading.py::test_unknown_model_id_is_a_user_error,
  ::test_missing_local_weights_is_a_user_error, tests/models/test_commands.py::test_bad_input (CLI);
* a corrupt or unfinished events.jsonl / attr.npz on resume: tests/instrument/test_passes.py::
  test_passes_resume_and_recompute_a_corrupt_artifact;
* foreign teacher targets: tests/distill/test_training.py::test_targets_refuse_events_free_trace_and_other_teacher;
* mismatched pairs, NaN and empty note sets inside the statistics: tests/stats/test_stats_bad_input.py;
* malformed numbers file, NaN in a numbers file, unknown result id, unknown template key:
  tests/repro/test_check.py, test_numbers.py, test_bless.py, test_render.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mistill.cli import main, one_line
from mistill.errors import UserError
from mistill.io import TRUNCATED, read_json, read_jsonl, read_npz, write_json, write_jsonl

WEIGHTS_HINT = "the file looks truncated or corrupt: retrain or re-fetch it (or restore it: dvc checkout)"


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


def one_error_line(err: str) -> str:
    """The CLI's stderr: exactly one `mistill: error: ...` line."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("mistill: error: ")
    return lines[0].removeprefix("mistill: error: ")


# ---- a tiny instrument world: params.yaml, inventory, traces and a tiny model, in tmp_path ------------

INVENTORY = [{"code": "N18.3", "description": "chronic kidney disease stage 3"},
             {"code": "I10", "description": "essential hypertension"}]
TRACES = [{"note_id": f"note{i}", "prompt": "a discharge summary", "completion": "<think>\nN18.3\n</think>\n\n[\"N18.3\"]"}
          for i in range(3)]


@pytest.fixture()
def instrument_world(tmp_path, monkeypatch):
    """params.yaml whose instrument reads traces.jsonl and inventory.jsonl and loads the teacher at model/."""
    params = {"profile": "t", "t": {"instrument": {"traces": "traces.jsonl", "inventory": "inventory.jsonl",
                                                   "out_dir": "out", "teacher": "model", "device": "cpu"}}}
    (tmp_path / "params.yaml").write_text(json.dumps(params))  # JSON is YAML
    write_jsonl(tmp_path / "inventory.jsonl", INVENTORY)
    write_jsonl(tmp_path / "traces.jsonl", TRACES)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from mistill.models.tokenizers import qwen3_tokenizer
    from tests.models.test_loading import QWEN, save_tiny

    path = tmp_path_factory.mktemp("tiny") / "model"
    save_tiny(path, QWEN, qwen3_tokenizer())
    return path


def copy_model(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target)
    return target


# ---- JSON and JSON-lines files (io.read_jsonl / read_json / iter_json_lines) ---------------------------


def test_truncated_traces_file_through_the_cli(instrument_world, capsys):
    traces = instrument_world / "traces.jsonl"
    text = traces.read_text()
    traces.write_text(text[: len(text) - 20])  # the last record cut off mid-way, no newline
    code, err = run_cli(capsys, "instrument", "events")
    assert code == 2
    assert one_error_line(err) == (f"traces.jsonl:3: not a JSON object at column 69 (unterminated string); "
                                   f"{TRUNCATED}")


def test_malformed_line_in_the_middle_is_not_called_truncated(tmp_path):
    path = tmp_path / "generations.jsonl"
    path.write_text('{"note_id": "a"}\n{"note_id": "b",\n{"note_id": "c"}\n')
    with pytest.raises(UserError) as err:
        read_jsonl(path, "generations")
    assert str(err.value) == (f"{path}:2: not a JSON object at column 17 (expecting property name enclosed in "
                              "double quotes); fix the line or rebuild the generations file")


def test_a_row_that_is_not_an_object(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"note_id": "a"}\n\n[1, 2]\n')
    with pytest.raises(UserError) as err:
        read_jsonl(path, "traces")
    assert str(err.value) == f"{path}:3: not a JSON object (a list); fix the line or rebuild the traces file"


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(UserError) as err:
        read_jsonl(tmp_path / "nowhere.jsonl", "traces")
    assert str(err.value) == f"{tmp_path / 'nowhere.jsonl'}: no such traces file"
    path = tmp_path / "binary.jsonl"
    path.write_bytes(b'{"a": 1}\n\xff\xfe\x00garbage\n')
    with pytest.raises(UserError) as err:
        read_jsonl(path, "traces")
    assert str(err.value) == f"{path}: not UTF-8 text (invalid start byte); is it a traces file?"


@pytest.mark.parametrize("text, line, column, reason, truncated", [
    ('{"a": [1, 2,', 1, 13, "expecting value", True),
    ('{\n  "a": "cut off he', 2, 8, "unterminated string", True),
    ('{"a": 1,, "b": 2}\n', 1, 9, "expecting property name enclosed in double quotes", False),
])
def test_corrupt_json_document(tmp_path, text, line, column, reason, truncated):
    path = tmp_path / "summary.json"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        read_json(path, "summary")
    hint = TRUNCATED if truncated else "fix it or rebuild the summary file"
    assert str(err.value) == f"{path}:{line}: not valid JSON at column {column} ({reason}); {hint}"


def test_empty_json_document(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text("\n")
    with pytest.raises(UserError) as err:
        read_json(path, "targets manifest")
    assert str(err.value) == f"{path}: empty targets manifest file; {TRUNCATED}"


# ---- model loading: weights and config ----------------------------------------------------------------


def test_truncated_weights_through_the_cli(instrument_world, tiny_model_dir, capsys):
    model = copy_model(tiny_model_dir, instrument_world / "model")
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    code, err = run_cli(capsys, "instrument", "events")
    assert code == 2
    assert one_error_line(err) == (f"model/model.safetensors: unreadable weights (Error while deserializing "
                                   f"header: incomplete metadata, file not fully covered); {WEIGHTS_HINT}")


def test_weights_cut_inside_the_header(tmp_path, tiny_model_dir):
    from mistill.models.loading import load_model

    model = copy_model(tiny_model_dir, tmp_path / "model")
    (model / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes()[:4])
    with pytest.raises(UserError) as err:
        load_model(str(model))
    assert str(err.value) == (f"{model}/model.safetensors: unreadable weights (Error while deserializing header: "
                              f"header too small); {WEIGHTS_HINT}")


def test_missing_shard_of_a_sharded_checkpoint(tmp_path, tiny_model_dir):
    from mistill.models.loading import load_model

    model = copy_model(tiny_model_dir, tmp_path / "model")
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    write_json(model / "model.safetensors.index.json",
               {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    with pytest.raises(UserError) as err:
        load_model(str(model))
    assert str(err.value) == (f"{model}/model-00002-of-00002.safetensors: missing weights shard named in "
                              "model.safetensors.index.json; re-fetch the checkpoint")


def test_corrupt_config_through_the_cli_is_not_an_unknown_model(instrument_world, tiny_model_dir, capsys):
    model = copy_model(tiny_model_dir, instrument_world / "model")
    config = model / "config.json"
    config.write_text(config.read_text()[:40])
    code, err = run_cli(capsys, "instrument", "events")
    message = one_error_line(err)
    assert code == 2 and "unknown model id" not in message
    assert message.startswith("model/config.json:") and message.endswith(TRUNCATED)


def test_config_that_is_not_a_model_config(tmp_path, tiny_model_dir):
    from mistill.models.loading import load_model

    model = copy_model(tiny_model_dir, tmp_path / "model")
    write_json(model / "config.json", {"hidden_size": 32})
    with pytest.raises(UserError) as err:
        load_model(str(model))
    assert str(err.value) == (f"{model}/config.json: no 'model_type' key; not a transformers model config "
                              "(re-save or re-fetch the checkpoint)")


def test_unknown_model_id_keeps_its_own_message(tmp_path, monkeypatch):
    from mistill.models.loading import load_model

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(UserError) as err:
        load_model("nobody-here/no-such-model")
    assert str(err.value).startswith("unknown model id 'nobody-here/no-such-model', or it is not in the local "
                                     "Hugging Face cache (nothing is downloaded): ")
    assert "\n" not in str(err.value)


# ---- per-note artifacts read on resume --------------------------------------------------------------


def test_truncated_events_report_is_recomputed_on_resume(tmp_path, capsys):
    from mistill.instrument.passes import run_events
    from tests.instrument.conftest import QwenTextTokenizer, _write_world, tiny_qwen3

    tokenizer = QwenTextTokenizer()
    model = tiny_qwen3(tokenizer.vocab_size, layers=1, heads=2, kv_heads=1, seed=1)
    cfg = _write_world(tmp_path)
    run_events(cfg, {"profile": "test"}, model=model, tokenizer=tokenizer)
    report = Path(cfg.out_dir) / "note1" / "events_report.json"
    good = report.read_text()
    report.write_text(good[: len(good) // 2])  # a report cut off by an interrupted copy
    capsys.readouterr()
    run_events(cfg, {"profile": "test"}, model=model, tokenizer=tokenizer)
    err = capsys.readouterr().err
    assert ("mistill instrument events: note1/events.jsonl is corrupt (its events_report.json is unreadable: "
            "truncated or corrupt); recomputing") in err
    assert "1 computed, 2 already done" in err
    assert report.read_text() == good


def test_truncated_teacher_targets(tmp_path):
    from mistill.distill.targets import read_note_targets

    path = tmp_path / "n1.npz"
    np.savez(path, top_ids=np.arange(40), meta=np.frombuffer(b"{}", dtype=np.uint8))
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(UserError) as err:
        read_note_targets(path)
    assert str(err.value) == (f"{path}: unreadable teacher targets (BadZipFile: File is not a zip file); "
                              f"{TRUNCATED}")


def test_npz_that_is_an_npy(tmp_path):
    path = tmp_path / "calibration.npz"
    with path.open("wb") as fh:
        np.save(fh, np.zeros(3))
    with pytest.raises(UserError) as err:
        read_npz(path, "calibration arrays")
    assert str(err.value) == (f"{path}: unreadable calibration arrays (ValueError: an .npy array, not an .npz "
                              f"archive); {TRUNCATED}")


def test_training_log_cut_off_by_a_killed_run(tmp_path):
    from mistill.distill.trainer import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    assert read_metrics(path) == [{"step": 1}, {"step": 2}]  # the cut-off line was logged before its checkpoint
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(UserError) as err:
        read_metrics(path)
    assert str(err.value) == (f"{path}:2: not a JSON object at column 13; the training log is corrupt: "
                              "remove the run directory to train afresh")


# ---- notes and comparisons ----------------------------------------------------------------------------


def test_empty_note_set(tmp_path):
    from mistill.world.notes import load_notes

    path = tmp_path / "dt_test.jsonl"
    path.write_text("\n")
    with pytest.raises(UserError) as err:
        load_notes(path)
    assert str(err.value) == (f"{path}: no notes in the file; rebuild it (`mistill world notes` / "
                              "`mistill world corpora`)")


def _arm_dir(root: Path, label: str, note_ids: list[str]) -> Path:
    path = root / "DT-eval" / f"{label}-s0"
    write_json(path / "task.json", {"metrics": {"micro_f1": 0.5, "valid_rate": 1.0}})
    write_jsonl(path / "generations.jsonl", [{"note_id": n, "valid": True, "answer": ["N18.3"]} for n in note_ids])
    return path


def test_mismatched_pairs_name_the_generations_file(tmp_path):
    from mistill.evaluate.readout import load_arm, per_note_f1
    from mistill.world.types import Note

    notes = [Note(n, "p", "text", ("N18.3",)) for n in ("a", "b", "c")]
    path = _arm_dir(tmp_path, "mistill", ["a", "b", "z"])  # evaluated on other notes than the test notes
    arm = load_arm(tmp_path / "DT-eval", "mistill")[0]
    with pytest.raises(UserError) as err:
        per_note_f1(arm, notes)
    assert str(err.value) == (f"{path}/generations.jsonl: no generation for 1 test notes (e.g. c): the generations "
                              "and the test notes differ; regenerate for these test notes")


def test_corrupt_evaluation_file(tmp_path):
    from mistill.evaluate.readout import load_arm

    path = _arm_dir(tmp_path, "vanilla", ["a"])
    write_json(path / "task.json", {"micro_f1": 0.5})
    with pytest.raises(UserError) as err:
        load_arm(tmp_path / "DT-eval", "vanilla")
    assert str(err.value) == f"{path}/task.json: no 'metrics' section; rerun the evaluation that writes it"


def test_nan_in_a_compared_value_names_the_arm(tmp_path):
    from mistill.evaluate.compare import arm_values

    m6 = tmp_path / "M6" / "mistill-s0"
    write_json(m6 / "faithfulness2.json", {"notes": ["a", "b"]})
    row = {"kind": "P2C", "pos": 1, "margin_corr": 0.0, "margin_all": 2.0, "knockin": {"top": {"4": 1.5}}}
    write_jsonl(m6 / "a" / "patch2.jsonl", [row])
    write_jsonl(m6 / "b" / "patch2.jsonl", [{**row, "margin_corr": float("nan")}])  # NaN is valid JSON here
    with pytest.raises(UserError) as err:
        arm_values(tmp_path, "mistill", "m4", phase="P2C", k=4)
    message = str(err.value)
    assert message.startswith(f"{m6}: P2C knock-in rows: ") and "non-finite" in message and "\n" not in message


# ---- parameters -----------------------------------------------------------------------------------------


def test_missing_profile_through_the_cli(tmp_path, monkeypatch, capsys):
    (tmp_path / "params.yaml").write_text("profile: papr\ndemo: {seeds: {}}\npaper: {seeds: {}}\n")
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(capsys, "world", "inventory")
    assert code == 2
    assert one_error_line(err) == "params.yaml: unknown profile 'papr' (no such section); it defines: demo, paper"


def test_profile_alias_naming_no_section(tmp_path, monkeypatch, capsys):
    (tmp_path / "params.yaml").write_text("demo: &demo {name: demo}\npaper: &paper {name: paper}\nprofile: *papr\n")
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(capsys, "world", "inventory")
    assert code == 2
    assert one_error_line(err) == ("params.yaml:3: found undefined alias 'papr': no profile section of that name; "
                                   "it defines: demo, paper")


def test_malformed_params_yaml_through_the_cli(tmp_path, monkeypatch, capsys):
    (tmp_path / "params.yaml").write_text("profile: demo\ndemo:\n  seeds: {corpus: 0\n  paths: x\n")
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(capsys, "world", "inventory")
    assert code == 2
    assert one_error_line(err) == ("params.yaml:4: not valid YAML (expected ',' or '}', but got ':'); "
                                   "fix the file")


def test_the_cli_prints_one_line_even_for_a_multi_line_message():
    assert one_line(UserError("cannot read x\n  because y\n")) == "cannot read x; because y"
