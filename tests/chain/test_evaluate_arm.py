"""`mistill evaluate arm` runs the four single commands of one arm's evaluation, in order, in one process."""

from pathlib import Path

from mistill.cli import main
from mistill.evaluate import commands as ev
from mistill.evaluate import generate_commands


def test_arm_runs_each_step_through_its_own_parser(monkeypatch):
    calls = []

    def recorder(name, status=0):
        def run(args):
            calls.append((name, args))
            return status
        return run

    monkeypatch.setattr(generate_commands, "cmd_generate", recorder("generate"))
    for name in ("task", "fidelity", "m1"):
        monkeypatch.setattr(ev, f"cmd_{name}", recorder(name))
    assert main(["evaluate", "arm", "--model", "runs/m", "--out-dir", "eval/a", "--m1-notes", "notes.jsonl"]) == 0
    assert [c[0] for c in calls] == ["generate", "task", "fidelity", "m1"]
    gen, task, fid, m1 = (c[1] for c in calls)
    out = Path("eval/a")
    assert (gen.model, gen.out) == ("runs/m", str(out / "generations.jsonl"))
    assert (task.generations, task.out) == (str(out / "generations.jsonl"), str(out / "task.json"))
    assert (fid.generations, fid.model, fid.out) == (str(out / "generations.jsonl"), "runs/m", str(out / "fidelity.json"))
    assert (m1.model, m1.notes, m1.out) == ("runs/m", "notes.jsonl", str(out / "m1.json"))
    # each step's own defaults apply (what the single command would have used)
    assert fid.threads is None and m1.teacher_traces is None and task.notes is None


def test_arm_stops_at_the_first_failing_step(monkeypatch):
    calls = []
    monkeypatch.setattr(generate_commands, "cmd_generate", lambda args: calls.append("generate") or 0)
    monkeypatch.setattr(ev, "cmd_task", lambda args: calls.append("task") or 3)
    monkeypatch.setattr(ev, "cmd_fidelity", lambda args: calls.append("fidelity") or 0)
    assert main(["evaluate", "arm", "--model", "m", "--out-dir", "d"]) == 3
    assert calls == ["generate", "task"]
