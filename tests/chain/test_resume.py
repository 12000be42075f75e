"""`dvc repro` resumes a killed per-note stage, and a missing profile destroys nothing.

A tiny DVC project in tmp_path holds the repository's own stage definitions (dvc.yaml's TR-006 and
inventory, their code deps copied in), a tiny world and a randomly initialised tiny teacher.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mistill.io import write_jsonl
from mistill.models.architectures import TinyArchitecture, build_model
from mistill.models.commands import save_model_dir
from mistill.models.tokenizers import CompactTokenizer, build_remap, qwen3_tokenizer

REPO = Path(__file__).resolve().parents[2]
N_NOTES = 6
CODES = [{"code": "N18.3", "description": "chronic kidney disease stage 3"},
         {"code": "N18.4", "description": "chronic kidney disease stage 4"},
         {"code": "E11.9", "description": "type 2 diabetes mellitus without complications"}]
NOTES = [{"note_id": f"n{i}", "patient_id": f"p{i}", "text": f"note {i} chronic kidney disease stage {3 + i % 2}",
          "gold_codes": [f"N18.{3 + i % 2}"], "split": "test"} for i in range(N_NOTES)]
PROFILE = {
    "name": "test",
    "paths": {"artifacts": "artifacts", "results": "results"},
    "seeds": {"decoding": 0, "inventory_shuffle": 0},
    "world": {"inventory": {"source": "icd10cm", "target_codes": 3}},
    "models": {"dir": "models/demo", "teacher": "models/demo/teacher", "revision": {"teacher": None},
               "vllm": {"tensor_parallel_size": 1}, "dtype": None, "attn_implementation": "eager",
               "generation_attn_implementation": "sdpa", "generation_backend": "transformers",
               "rope_scaling": {"teacher": None}, "threads": 1, "device": "cpu"},
    # long enough per note for the kill to land between notes
    "decoding": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 64},
}
DONE = re.compile(r"TR-006: (\d+) notes computed, (\d+) reused")


def write_project(root: Path, stage_names: list[str]) -> Path:
    """A DVC project (no git) with the named stages of the repository's dvc.yaml and their inputs."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    root.mkdir(parents=True)
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {s: stages[s] for s in stage_names}}, sort_keys=False))
    write_params(root, PROFILE)
    for name in stage_names:
        for dep in stages[name].get("deps", []):
            if dep.startswith("src/"):
                (root / dep).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / dep, root / dep)
    data = root / "artifacts" / "data"
    write_jsonl(data / "inventory.jsonl", CODES)
    write_jsonl(data / "corpus_char.jsonl", NOTES)
    write_jsonl(data / "dt_train.jsonl", NOTES[:2])
    write_jsonl(data / "dt_test.jsonl", NOTES[2:4])
    write_jsonl(data / "shortlists.jsonl", [{"note_id": n["note_id"], "codes": ["N18.3", "N18.4"]} for n in NOTES])
    base = qwen3_tokenizer()
    tokenizer = CompactTokenizer(base, build_remap(base, [json.dumps(CODES), json.dumps(NOTES)]))
    arch = TinyArchitecture.from_params({"family": "qwen3", "hidden_size": 32, "intermediate_size": 64,
                                         "num_hidden_layers": 2, "num_attention_heads": 4,
                                         "num_key_value_heads": 2, "head_dim": 8})
    model = build_model(arch, vocab_size=tokenizer.vocab_size, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id, seed=0)
    save_model_dir(model, tokenizer, root / "models" / "demo" / "teacher", {})
    dvc(root, "init", "--no-scm", "-q")
    return root


def write_params(root: Path, profile: dict) -> None:
    """params.yaml as the repository writes it: the section, then `profile: *test` aliasing it."""
    body = yaml.safe_dump({"test": profile}, sort_keys=False).replace("test:\n", "test: &test\n", 1)
    (root / "params.yaml").write_text(body + "profile: *test\n")


def read_profile(root: Path) -> dict:
    return yaml.safe_load((root / "params.yaml").read_text())["test"]


def dvc_env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)  # `mistill` of this venv
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "DVC_NO_ANALYTICS": "1"}


def dvc(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, env=dvc_env(), capture_output=True,
                            text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"dvc {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def complete_lines(path: Path) -> int:
    if not path.exists():
        return 0
    return path.read_bytes().count(b"\n")


def kill_after(root: Path, target: Path, notes: int) -> None:
    """`dvc repro TR-006`, SIGKILLed (with the command it runs) once `target` holds `notes` rows."""
    proc = subprocess.Popen([sys.executable, "-m", "dvc", "repro", "TR-006"], cwd=root, env=dvc_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while complete_lines(target) < notes:
            assert proc.poll() is None, "the stage finished before it could be killed"
            assert time.monotonic() < deadline, "no progress in the trace file"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_killed_trace_stage_resumes_under_dvc_repro(tmp_path, monkeypatch):
    root = write_project(tmp_path / "project", ["TR-006"])
    # batches of 2 notes, so a kill can land between batches; the reference run below samples all
    # six in one batch and must still write the same bytes (rows keep their own seeds' streams)
    dvc_yaml = root / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace("--set TR-006", "--set TR-006 --batch 2"))
    reference = tmp_path / "reference"
    shutil.copytree(root, reference, ignore=shutil.ignore_patterns(".dvc", "dvc.yaml"))
    traces = root / "artifacts" / "TR-006" / "traces.jsonl"

    kill_after(root, traces, 2)
    kept = complete_lines(traces)
    assert 2 <= kept < N_NOTES
    rerun = dvc(root, "repro", "TR-006")
    computed, reused = map(int, DONE.search(rerun.stdout).groups())
    assert (computed, reused) == (N_NOTES - kept, kept)  # only the missing notes
    assert "up to date" in dvc(root, "status").stdout

    # an uninterrupted run of the same command: the same bytes
    from mistill.cli import main

    monkeypatch.chdir(reference)
    assert main(["models", "traces", "--set", "TR-006"]) == 0
    for name in ("traces.jsonl", "summary.json"):
        assert (root / "artifacts" / "TR-006" / name).read_bytes() == \
            (reference / "artifacts" / "TR-006" / name).read_bytes(), name
    assert json.loads((root / "artifacts" / "TR-006" / "timing.json").read_text())["reused"] == kept


def test_rows_of_other_inputs_are_recomputed(tmp_path, monkeypatch):
    """A kept row whose note now has another prompt (a changed note) is generated again, the rest reused."""
    from mistill.cli import main

    root = write_project(tmp_path / "project", ["TR-006"])
    monkeypatch.chdir(root)
    assert main(["models", "traces", "--set", "TR-006", "--limit", "3"]) == 0
    notes = [dict(n) for n in NOTES]
    notes[1]["text"] += " stable"
    write_jsonl(root / "artifacts" / "data" / "corpus_char.jsonl", notes)
    assert main(["models", "traces", "--set", "TR-006", "--limit", "3"]) == 0
    timing = json.loads((root / "artifacts" / "TR-006" / "timing.json").read_text())
    assert (timing["computed"], timing["reused"]) == (1, 2)


@pytest.mark.parametrize("persist", [True, False])
def test_a_missing_profile_removes_no_output(tmp_path, persist):
    """`profile: *nope` names no section: params.yaml is not valid YAML (an undefined alias), so DVC stops
    while reading it, before it removes any stage's outputs, persist or not."""
    root = write_project(tmp_path / "project", ["inventory", "TR-006"])
    for dep in ("src/mistill/world/inventory.py", "src/mistill/world/icd.py", "src/mistill/world/mimic.py"):
        assert (root / dep).exists()
    data = root / "artifacts" / "data"
    (data / "inventory.provenance.json").write_text("{}\n")
    before = {p: p.read_bytes() for p in (data / "inventory.jsonl", data / "inventory.provenance.json")}
    if not persist:  # without persist too: nothing runs, so nothing is removed
        spec = yaml.safe_load((root / "dvc.yaml").read_text())
        spec["stages"]["inventory"]["outs"] = [next(iter(o)) if isinstance(o, dict) else o
                                               for o in spec["stages"]["inventory"]["outs"]]
        (root / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    params = (root / "params.yaml").read_text().replace("profile: *test", "profile: *nope")
    (root / "params.yaml").write_text(params)
    result = dvc(root, "repro", check=False)
    assert result.returncode != 0
    # libyaml's parser (ruamel.yaml.clib) names the line of the bad alias; pure Python names the alias
    line = 1 + params.splitlines().index("profile: *nope")
    assert "undefined alias" in result.stderr and ("nope" in result.stderr or f"line {line}," in result.stderr)
    assert {p: p.read_bytes() for p in before if p.exists()} == before


def test_generation_rows_follow_their_inputs(tmp_path, monkeypatch, capsys):
    """`mistill evaluate generate` (the EV stages) keeps a row only under the same input key: a note whose
    shortlist (so its prompt) changed is sampled again; a retrained model at the same path redoes all."""
    from mistill.cli import main

    root = write_project(tmp_path / "project", ["TR-006"])
    write_params(root, {**read_profile(root), "evaluate": {"test_notes": "artifacts/data/corpus_char.jsonl"}})
    monkeypatch.chdir(root)
    out = root / "artifacts" / "DT-eval" / "arm" / "generations.jsonl"
    argv = ["evaluate", "generate", "--model", "models/demo/teacher", "--out", str(out), "--limit", "3",
            "--batch", "2", "--threads", "1"]

    def counts() -> tuple[int, int]:
        assert main(argv) == 0
        found = re.search(r"\((\d+) computed, (\d+) reused\)", capsys.readouterr().out)
        return int(found[1]), int(found[2])

    assert counts() == (3, 0)
    first = out.read_bytes()
    assert counts() == (0, 3) and out.read_bytes() == first
    shortlists = [{"note_id": n["note_id"], "codes": ["N18.3", "N18.4"] if n["note_id"] != "n2" else ["N18.3"]}
                  for n in NOTES]
    write_jsonl(root / "artifacts" / "data" / "shortlists.jsonl", shortlists)
    assert counts() == (1, 2)
    (root / "models" / "demo" / "teacher" / "generation_config.json").write_text("{}\n")  # another checkpoint
    assert counts() == (3, 0)


def test_teacher_targets_resume_per_note_and_recompute_another_teachers(tmp_path, monkeypatch):
    """DT-targets (persist): a killed pass leaves no manifest and keeps its finished notes; another
    teacher's notes are recomputed, not refused; files of notes no longer listed are removed."""
    import numpy as np
    import torch

    from mistill.distill import targets as tg

    computed: list[str] = []

    def fake_targets(model, tokenizer, prompt, completion, events, pools, prose_pool, *, window, topk, note_id):
        if note_id == "n2" and "kill" in prompt:
            raise KeyboardInterrupt  # the run dies here
        computed.append(note_id)
        return {"top_ids": np.zeros((1, 1), dtype=np.int64), "meta": np.frombuffer(b"{}", dtype=np.uint8)}

    monkeypatch.setattr(tg, "note_targets", fake_targets)
    monkeypatch.setattr(tg, "load_events", lambda path, note_id: [])
    out = tmp_path / "DT-targets"

    def run(teacher, traces):
        computed.clear()
        return tg.compute_targets(teacher, None, traces, tmp_path / "events", out, {}, None, window=0, topk=4,
                                  teacher_id="t", provenance={})

    teacher = torch.nn.Linear(2, 2)
    traces = [{"note_id": f"n{i}", "prompt": "p", "completion": "c"} for i in range(4)]
    with pytest.raises(KeyboardInterrupt):
        run(teacher, [*traces[:2], {**traces[2], "prompt": "kill"}, traces[3]])
    assert computed == ["n0", "n1"] and not (out / "manifest.json").exists()
    run(teacher, traces)
    assert computed == ["n2", "n3"] and (out / "manifest.json").exists()
    run(teacher, traces[1:])
    assert computed == [] and sorted(p.name for p in out.glob("*.npz")) == ["n1.npz", "n2.npz", "n3.npz"]
    with torch.no_grad():
        teacher.weight.add_(1.0)  # another teacher
    assert run(teacher, traces[1:])["notes"] == ["n1", "n2", "n3"] and computed == ["n1", "n2", "n3"]
