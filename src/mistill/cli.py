"""`mistill <group> <command> [...]`: the one entry point every DVC stage calls.

Each layer owns its commands in `mistill/<group>/commands.py`, which exposes
`register(subparsers)`; that module adds one subparser per command and sets
`func` on it.  Groups are imported lazily so `mistill repro check` never pays
for importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from mistill import warm
from mistill.errors import UserError
from mistill.repro.stage_times import recorded
from mistill.repro.stale_outputs import guard_stage

GROUPS = {
    "world": "corpora, inventory, prompts, shortlists",
    "models": "tokenizers, tiny demo models, generation, teacher traces",
    "instrument": "events, attribution, patching, knock-in, calibration",
    "locus": "the prose locus: forcing probe, window attribution, prose-time set (App. F)",
    "control": "controls of the characterization: the instruction control's views (App. B)",
    "distill": "span buckets, teacher targets, head pools, training arms",
    "baselines": "the baseline arms of Table 2: Feature-KD, DistiLLM-2, OPD, GOLD",
    "evaluate": "task, fidelity and mechanism metrics",
    "simulator": "the learned answer simulator of LAS (App. K)",
    "repro": "registry, numbers files, tolerance checks, paper rendering",
    "rehearsal": "the paper profile's chain on stand-ins, before any GPU hour is spent",
}
# The groups whose commands compute with torch: on a CPU without bf16 GEMM kernels their bf16 matrix
# products run through fp32 (mistill.models.cpu_bf16).
TORCH_GROUPS = ("models", "instrument", "locus", "distill", "baselines", "evaluate", "simulator")


def build_parser(group: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mistill", description=__doc__.splitlines()[0])
    groups = parser.add_subparsers(dest="group", metavar="GROUP", required=True)
    for name, summary in GROUPS.items():
        sub = groups.add_parser(name, help=summary, description=summary)
        if name == group:
            commands = sub.add_subparsers(dest="command", metavar="COMMAND", required=True)
            importlib.import_module(f"mistill.{name}.commands").register(commands)
    return parser


def one_line(err: BaseException) -> str:
    """The error's message on one line (a message that quotes a multi-line text joins its lines)."""
    return "; ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__


def main(argv: list[str] | None = None) -> int:
    # a process of its own (not a call with arguments) hands itself to the warm interpreter when one runs
    if argv is None and (status := warm.delegate(sys.argv[1:])) is not None:
        return status
    argv = list(sys.argv[1:] if argv is None else argv)
    group = argv[0] if argv and argv[0] in GROUPS else None
    args = build_parser(group).parse_args(argv)
    try:
        guard_stage()   # under `dvc repro`: no persisted output outlives the code that made it
        sharded = getattr(args, "sharded", None)
        if sharded:   # a per-note pass: as many processes as params ask for
            from mistill.params import load_params
            from mistill.shard import gpus_per_pass, relaunch

            processes = gpus_per_pass if sharded is True else sharded   # or the command's own rule
            relaunch(argv, processes(load_params(profile=getattr(args, "profile", None))))
        if group in TORCH_GROUPS:
            from mistill.models import cpu_bf16

            cpu_bf16.install()
        with recorded(argv):   # a stage's wall time, when DVC runs this command as one
            result = args.func(args)
    except UserError as err:
        print(f"mistill: error: {one_line(err)}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
