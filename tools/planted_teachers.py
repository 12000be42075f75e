"""Train candidate planted demo teachers side by side on one GPU, and summarise their training logs.

    python tools/planted_teachers.py train tools/planted_teachers.yaml --out /tmp/planted [--epochs 6]
    python tools/planted_teachers.py summary /tmp/planted
    python tools/planted_teachers.py score tools/planted_teachers.yaml --out /tmp/planted [--only NAME,...]

The YAML maps a configuration's name to the teacher's planted section (params
`models.teacher_training.planted.teacher`: each phase's heads, the weight, `ablate_share`, `consistency`,
or the knock-out form's `necessity`, `held_probes`, `held_weight`; `mistill.models.planted`). Each
configuration trains in a scratch directory of its own under `--out` (its params.yaml with that section,
every other top-level entry of this checkout a symlink), all at once: the demo teacher is small enough that
several share one GPU. `--init DIR` starts each from a trained teacher instead of a fresh initialisation.
`summary` prints, per quarter of each run, the means of what the steps logged (cross-entropy, routing
term R, margin gap; the knock-out form's planted drop, shortfall and held move).

`score` measures each trained candidate on this machine as docs/demo-world.md "A planted mechanism" does: in a
scratch checkout with its `teacher` in place of models/demo/teacher (its own artifacts/, the data copied from
this checkout's artifacts/data), the characterization traces (TR-006's command) and the instrument
(HD-001's), then TR-006's micro-F1, the notes HD-001 keeps, and each phase's planted recall and ranks (R-C3's
`planted_recall_<phase>`, `planted_ranks_<phase>`). Run `dvc repro corpora` first when artifacts/data is empty.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ANCHOR = "      attn_implementation: sdpa"   # the last line of the demo's teacher_training section
# what `summary` prints of a step's log, per quarter of the run
SUMMARY = {"cross_entropy": "CE", "routing": "R", "margin_gap": "margin gap", "planted_drop": "planted drop",
           "necessity_shortfall": "shortfall", "held_move": "held move"}


def params_with_planted(text: str, planted: dict) -> str:
    """params.yaml's text with the demo teacher's planted section added after its training section's last line."""
    at = text.index(ANCHOR)
    end = text.index("\n", at) + 1
    flow = yaml.safe_dump({"teacher": planted}, default_flow_style=True, width=10_000).strip()
    return text[:end] + f"      planted: {flow}\n" + text[end:]


def scratch_checkout(root: Path, planted: dict) -> None:
    """A directory that reads as this checkout, its params.yaml carrying `planted`."""
    root.mkdir(parents=True, exist_ok=True)
    for entry in REPO.iterdir():
        target = root / entry.name
        if entry.name in ("params.yaml", ".git") or target.exists() or target.is_symlink():
            continue
        target.symlink_to(entry)
    (root / "params.yaml").write_text(params_with_planted((REPO / "params.yaml").read_text(), planted))


def child_env() -> dict[str, str]:
    """The environment of a `mistill` child process: this checkout's src first, output unbuffered."""
    return {**os.environ, "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}


def cmd_train(args: argparse.Namespace) -> int:
    configs = yaml.safe_load(Path(args.configs).read_text())
    env = child_env()
    only = set(args.only.split(",")) if args.only else set(configs)
    running = []
    for name, planted in configs.items():
        if name not in only:
            continue
        root = Path(args.out) / name
        scratch_checkout(root, planted)
        command = [sys.executable, "-m", "mistill.cli", "models", "train-teacher", "--device", args.device,
                   "--out", str(root / "teacher"), *(["--epochs", str(args.epochs)] if args.epochs else []),
                   *(["--max-steps", str(args.max_steps)] if args.max_steps else []),
                   *(["--init", str(Path(args.init).resolve())] if args.init else [])]
        log = (root / "train.log").open("w")
        running.append((name, subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)))
    failed = [name for name, process in running if process.wait() != 0]
    for name in failed:
        print(f"{name}: training failed, see {Path(args.out) / name / 'train.log'}", file=sys.stderr)
    summarise(Path(args.out))
    return 1 if failed else 0


def summarise(out: Path) -> None:
    for log_path in sorted(out.glob("*/teacher/training_log.json")):
        steps = [row for row in yaml.safe_load(log_path.read_text())["steps"] if "cross_entropy" in row]
        if not steps:
            continue
        quarter = max(1, len(steps) // 4)
        for start in range(0, len(steps), quarter):
            rows = steps[start:start + quarter]
            means = {key: statistics.mean(r[key] for r in rows if key in r) for key in SUMMARY
                     if any(key in r for r in rows)}
            print(f"{log_path.parent.parent.name}  steps {start}-{start + len(rows) - 1}: "
                  + "  ".join(f"{SUMMARY[key]} {value:.4f}" for key, value in means.items()))


def scoring_checkout(root: Path, planted: dict, teacher: Path) -> None:
    """A scratch checkout whose demo teacher is `teacher`, with artifacts of its own (the data copied)."""
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(REPO / "artifacts" / "data", root / "artifacts" / "data")
    demo = root / "models" / "demo"
    demo.mkdir(parents=True)
    for entry in (REPO / "models").iterdir():
        if entry.name != "demo":
            (root / "models" / entry.name).symlink_to(entry)
    for entry in (REPO / "models" / "demo").iterdir():
        (demo / entry.name).symlink_to(teacher.resolve() if entry.name == "teacher" else entry)
    scratch_checkout(root, planted)


def score(root: Path, planted: dict) -> dict:
    """TR-006's micro-F1, the notes HD-001 keeps and each phase's planted recall and ranks, in checkout `root`."""
    sys.path.insert(0, str(REPO / "src"))
    from mistill.evaluate.task import micro_f1
    from mistill.models.planted import PLANTED_PHASES, PlantedHeads, planted_ranks, planted_recall
    from mistill.world.notes import load_notes

    traces = [json.loads(line) for line in (root / "artifacts" / "TR-006" / "traces.jsonl").read_text().splitlines()]
    gold = {n.note_id: list(n.gold_codes) for n in load_notes(root / "artifacts" / "data" / "corpus_char.jsonl")}
    out = {"tr006_micro_f1": micro_f1([t.get("answer") or [] if t.get("valid") else [] for t in traces],
                                      [gold[t["note_id"]] for t in traces])}
    summary = json.loads((root / "artifacts" / "HD-001" / "events_summary.json").read_text())
    out["notes_kept"] = f"{summary['notes']} of {len(traces)}"
    body = json.loads((root / "artifacts" / "HD-001" / "head_sets_contrast.json").read_text())
    heads = PlantedHeads.from_params(planted, n_layers=body["n_layers"], n_heads=body["n_heads"])
    for phase in PLANTED_PHASES:
        ranked = [(row["layer"], row["head"]) for row in body["phases"][phase]]
        out[f"recall_{phase}"] = planted_recall(ranked, heads.sets[phase])
        out[f"ranks_{phase}"] = list(planted_ranks(ranked, heads.sets[phase]).values())
    return out


def cmd_score(args: argparse.Namespace) -> int:
    configs = yaml.safe_load(Path(args.configs).read_text())
    only = set(args.only.split(",")) if args.only else set(configs)
    env = child_env()
    for name, planted in configs.items():
        teacher = Path(args.out) / name / "teacher"
        if name not in only or not (teacher / "model.safetensors").is_file():
            continue
        root = Path(args.out) / name / "score"
        if (root / "artifacts" / "HD-001" / "head_sets_contrast.json").is_file():   # scored before: read again
            print(f"{name}: {json.dumps(score(root, planted))}")
            continue
        scoring_checkout(root, planted, teacher)
        log = (Path(args.out) / name / "score.log").open("w")
        for command in (["models", "traces", "--set", "TR-006", "--model", "models/demo/teacher"], ["instrument", "all"]):
            if subprocess.run([sys.executable, "-m", "mistill.cli", *command], cwd=root, env=env, stdout=log,
                              stderr=subprocess.STDOUT).returncode:
                print(f"{name}: `mistill {' '.join(command)}` failed, see {log.name}", file=sys.stderr)
                break
        else:
            print(f"{name}: {json.dumps(score(root, planted))}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    train = verbs.add_parser("train", help="train every configuration of a YAML file at once")
    train.add_argument("configs", help="YAML: name -> planted section")
    train.add_argument("--out", required=True, help="one scratch directory per configuration under here")
    train.add_argument("--epochs", type=int, help="override models.teacher_training.epochs")
    train.add_argument("--max-steps", type=int, help="stop each run after this many steps (a smoke run)")
    train.add_argument("--init", help="start every configuration from this trained teacher (a planted fine-tune)")
    train.add_argument("--only", help="comma list of configuration names")
    train.add_argument("--device", default="cuda")
    train.set_defaults(func=cmd_train)
    scoring = verbs.add_parser("score", help="the characterization traces and instrument on each trained candidate")
    scoring.add_argument("configs", help="YAML: name -> planted section (the file the candidates trained from)")
    scoring.add_argument("--out", required=True, help="the candidates' directories (<out>/<name>/teacher)")
    scoring.add_argument("--only", help="comma list of configuration names")
    scoring.set_defaults(func=cmd_score)
    summary = verbs.add_parser("summary", help="per-quarter means of the training logs under a directory")
    summary.add_argument("out")
    summary.set_defaults(func=lambda args: summarise(Path(args.out)) or 0)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
