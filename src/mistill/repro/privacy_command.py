"""`mistill repro privacy [PATHS...] [--shareable]`: the privacy guard (`mistill.repro.privacy`) over
results/, paper/build/ and the given paths, or over the outputs the profile sends to its shareable DVC remote
(`mistill.repro.remotes`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mistill.repro import privacy
from mistill.repro.remotes import check_shareable


def register(subparsers: argparse._SubParsersAction) -> None:
    sub = subparsers.add_parser(
        "privacy", help="scan results/, paper/build/ and given files for note text, trace text and note ids",
        description=privacy.__doc__.splitlines()[0])
    sub.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                     help="more files or directories to scan (logs meant for release, a remote's export)")
    sub.add_argument("--profile", help="profile whose notes and traces count (default: params.yaml's active one)")
    sub.add_argument("--results", type=Path, help="numbers files directory (default: params paths.results)")
    sub.add_argument("--paper-build", type=Path, default=Path("paper/build"), help="rendered paper directory")
    sub.add_argument("--shareable", action="store_true",
                     help="scan instead the outputs the profile sends to its shareable DVC remote (params "
                          "remotes.shareable_outputs): their files' text and their file names")
    sub.set_defaults(func=cmd_privacy)


def cmd_privacy(args: argparse.Namespace) -> int:
    from mistill.params import load_params

    params = load_params(profile=args.profile)
    results = args.results or Path(params.get("paths", {}).get("results", "results"))
    if args.shareable:
        report = check_shareable(params)
    else:
        report = privacy.run_privacy(params, [results, args.paper_build, *args.paths], required=args.paths)
    for note in report.notes:
        print(f"privacy: {note}")
    for finding in report.findings:
        print(finding.format(), file=sys.stderr)
    print(report.summary())
    return 1 if report.findings else 0
