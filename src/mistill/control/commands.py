"""`mistill control <step>`: the controls of the characterization (App. B).

    view    one run's notes under another run's global sets, for the knock-in pass -> <out>/ (R-C14's KI-A-orig)
"""

from __future__ import annotations

import argparse


def _view(args) -> int:
    from mistill.control.views import write_view

    n = write_view(args.run, args.sets, args.out)
    print(f"control view: {n} notes of {args.run} under {args.sets} -> {args.out}")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("view", help="a run's notes under another run's global sets (knock them in)",
                            description="a run's notes under another run's global sets (knock them in)")
    p.add_argument("--run", required=True, help="the run whose notes (events, attributions) to read")
    p.add_argument("--sets", required=True, help="the head_sets_contrast.json whose global sets to knock in")
    p.add_argument("--out", required=True, help="the view's directory")
    p.set_defaults(func=_view)
