"""Train candidate planted demo teachers side by side on one GPU, and summarise their training logs.

    python tools/planted_teachers.py train tools/planted_teachers.yaml --out /tmp/planted [--epochs 6]
    python tools/planted_teachers.py summary /tmp/planted

The YAML maps a configuration's name to the teacher's planted section (params
`models.teacher_training.planted.teacher`: each phase's heads, the routing weight, `ablate_share`,
`consistency`; `mistill.models.planted`). Each configuration trains in a scratch directory of its own under
`--out` (its params.yaml with that section, every other top-level entry of this checkout a symlink), all
at once: the demo teacher is small enough that several share one GPU. `summary` prints, per quarter of
each run, the mean cross-entropy, routing term R and margin gap.

A trained candidate is scored as docs/demo-world.md "A planted mechanism" says: its `teacher` directory in
place of models/demo/teacher and its section in params.yaml, then `dvc repro -s TR-006`, `-s HD-001` and
`-s R-C3` (R-C3's `planted_recall_<phase>` and `planted_ranks_<phase>`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ANCHOR = "      attn_implementation: sdpa"   # the last line of the demo's teacher_training section


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


def cmd_train(args: argparse.Namespace) -> int:
    configs = yaml.safe_load(Path(args.configs).read_text())
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    running = []
    for name, planted in configs.items():
        root = Path(args.out) / name
        scratch_checkout(root, planted)
        command = [sys.executable, "-m", "mistill.cli", "models", "train-teacher", "--device", args.device,
                   "--out", str(root / "teacher"), *(["--epochs", str(args.epochs)] if args.epochs else []),
                   *(["--max-steps", str(args.max_steps)] if args.max_steps else [])]
        log = (root / "train.log").open("w")
        running.append((name, subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)))
    failed = [name for name, process in running if process.wait() != 0]
    for name in failed:
        print(f"{name}: training failed, see {Path(args.out) / name / 'train.log'}", file=sys.stderr)
    summarise(Path(args.out))
    return 1 if failed else 0


def summarise(out: Path) -> None:
    for log_path in sorted(out.glob("*/teacher/training_log.json")):
        steps = [row for row in yaml.safe_load(log_path.read_text())["steps"] if "routing" in row]
        if not steps:
            continue
        quarter = max(1, len(steps) // 4)
        for start in range(0, len(steps), quarter):
            rows = steps[start:start + quarter]
            gap = [r["margin_gap"] for r in rows if "margin_gap" in r]
            print(f"{log_path.parent.parent.name}  steps {start}-{start + len(rows) - 1}: "
                  f"CE {statistics.mean(r['cross_entropy'] for r in rows):.4f}  "
                  f"R {statistics.mean(r['routing'] for r in rows):.5f}"
                  + (f"  margin gap {statistics.mean(gap):.4f}" if gap else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    train = verbs.add_parser("train", help="train every configuration of a YAML file at once")
    train.add_argument("configs", help="YAML: name -> planted section")
    train.add_argument("--out", required=True, help="one scratch directory per configuration under here")
    train.add_argument("--epochs", type=int, help="override models.teacher_training.epochs")
    train.add_argument("--max-steps", type=int, help="stop each run after this many steps (a smoke run)")
    train.add_argument("--device", default="cuda")
    train.set_defaults(func=cmd_train)
    summary = verbs.add_parser("summary", help="per-quarter means of the training logs under a directory")
    summary.add_argument("out")
    summary.set_defaults(func=lambda args: summarise(Path(args.out)) or 0)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
