"""`mistill repro ...`: check numbers against expected values, render the paper, keep REGISTRY.md current.

    mistill repro check [IDS...] [--profile P] [--results DIR]
    mistill repro render [--strict] [--results DIR] [--out paper/build] [--templates paper/templates]
    mistill repro registry-md [--check]
    mistill repro bless IDS... [--accept-breach REASON] [--profile P] [--results DIR]
    mistill repro privacy [PATHS...] [--shareable]
    mistill repro publish [TARGETS...] [--dry-run]
    mistill repro plot-data --runs DIR... --out DIR
    mistill repro family FILE NAME [--item NAME ...] [--dry]
    mistill repro directions [--markdown | --readme [PATH]] [--profile P] [--results DIR]

`render` also draws the figures of paper/templates/figures/ (PDF and PNG, mistill.repro.figures).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mistill.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    check = subparsers.add_parser("check", help="every numbers file against its profile's expected values")
    check.add_argument("ids", nargs="*", metavar="ID", help="restrict to these result ids (default: all 62)")
    _common(check)
    check.set_defaults(func=cmd_check)

    render = subparsers.add_parser("render", help="rebuild paper tables and macros from the numbers files")
    render.add_argument("--strict", action="store_true",
                        help="fail on a missing number of a result the profile claims (others show ??)")
    render.add_argument("--out", type=Path, default=Path("paper/build"), help="output directory")
    render.add_argument("--templates", type=Path, default=Path("paper/templates"), help="template directory")
    _common(render)
    render.set_defaults(func=cmd_render)

    directions = subparsers.add_parser(
        "directions", help="Mistill minus Vanilla CoT-KD: the run's direction beside the paper's, key by key",
        description="Every Mistill-versus-Vanilla key of R-D5, R-D6, R-D18 and R-D19: the run's value, 95%% interval "
                    "and direction beside the paper's (mistill.repro.directions says which keys, and the rule).")
    shown = directions.add_mutually_exclusive_group()
    shown.add_argument("--markdown", action="store_true", help="print README's Markdown table")
    shown.add_argument("--readme", nargs="?", const=Path("README.md"), type=Path, metavar="PATH",
                       help="rewrite the table between the direction markers of README.md (or PATH)")
    _common(directions)
    directions.set_defaults(func=cmd_directions)

    md = subparsers.add_parser("registry-md", help="regenerate REGISTRY.md from registry.yaml")
    md.add_argument("--check", action="store_true", help="exit non-zero when REGISTRY.md is stale; write nothing")
    md.set_defaults(func=cmd_registry_md)

    bless = subparsers.add_parser("bless", help="record current numbers as the profile's goldens")
    bless.add_argument("ids", nargs="+", metavar="ID")
    bless.add_argument("--accept-breach", metavar="REASON",
                       help="bless even though values breach the current goldens; the reason is recorded")
    _common(bless)
    bless.set_defaults(func=cmd_bless)

    warm = subparsers.add_parser(
        "warm", help="run a command (dvc repro ...) with one warm interpreter for the mistill stages it starts",
        description="Run a command while a server that has imported torch and transformers forks each "
                    "`mistill` it starts (mistill.warm); the stages compute what they compute cold.")
    warm.add_argument("command", nargs=argparse.REMAINDER, help="the command, e.g. dvc repro R-D6")
    warm.set_defaults(func=cmd_warm)

    family = subparsers.add_parser(
        "family", help="run a family's items (a foreach or matrix stage of a family file) whose inputs changed",
        description="Run the items of one foreach or matrix stage of a family file (dvc.yaml syntax, never read by "
                    "DVC) whose commands, params or dependencies changed since their last run (mistill.repro.families).")
    family.add_argument("file", help="the family file, e.g. pipelines/own-heads/families.yaml")
    family.add_argument("name", help="the family: a foreach or matrix stage of that file")
    family.add_argument("--item", action="append", dest="items", metavar="NAME",
                        help="only this item (its full name, e.g. M6-variant@nowindow); repeatable")
    family.add_argument("--dry", action="store_true", help="list the commands of the items that would run")
    family.set_defaults(func=cmd_family)

    read = subparsers.add_parser("read", help="run a result's reader (registry.yaml names it) -> results/<ID>.json",
                                 description="Run the reader of one result id; arguments after the id pass through.")
    read.add_argument("id", metavar="ID")
    read.add_argument("reader_args", nargs=argparse.REMAINDER, help="passed to the reader")
    read.set_defaults(func=cmd_read)

    from mistill.repro.privacy_command import register as register_privacy  # `mistill repro privacy`
    register_privacy(subparsers)
    from mistill.repro.remotes import register as register_publish  # `mistill repro publish`
    register_publish(subparsers)
    from mistill.repro.stage_times import register as register_stage_times  # `mistill repro stage-times`
    register_stage_times(subparsers)
    from mistill.repro.calibration_commands import register as register_calibrate  # `mistill repro calibrate`
    register_calibrate(subparsers)
    from mistill.repro.mutants import register as register_mutants  # `mistill repro mutants`
    register_mutants(subparsers)
    from mistill.repro.grid import register as register_grid  # `mistill repro grid`
    register_grid(subparsers)
    from mistill.repro.plot_data import register as register_plot_data  # `mistill repro plot-data`
    register_plot_data(subparsers)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", help="profile to check against (default: params.yaml's active profile)")
    parser.add_argument("--results", type=Path, help="numbers files directory (default: params paths.results)")


def _resolve(args: argparse.Namespace) -> tuple[str, Path]:
    """The profile and results directory: flags first, else params.yaml."""
    profile, results = args.profile, args.results
    if profile is None or results is None:
        from mistill.params import load_params

        params = load_params(profile=profile)
        profile = profile or params["profile"]
        results = results or Path(params.get("paths", {}).get("results", "results"))
    return profile, Path(results)


def cmd_warm(args: argparse.Namespace) -> int:
    from mistill.warm import run_warm

    if not args.command:
        raise UserError("mistill repro warm: give the command to run, e.g. `mistill repro warm dvc repro R-D6`")
    return run_warm(args.command)


def cmd_family(args: argparse.Namespace) -> int:
    from mistill.repro.families import run_family

    run_family(Path("."), args.file, args.name, only=args.items, dry=args.dry)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from mistill.repro.check import run_check
    from mistill.repro.registry import load_registry

    registry = load_registry()
    profile, results = _resolve(args)
    report = run_check(registry, profile, results, args.ids)
    print(report.format())
    return 1 if report.failed else 0


def cmd_render(args: argparse.Namespace) -> int:
    from mistill.repro.registry import load_registry
    from mistill.repro.render import render_paper

    registry = load_registry()
    profile, results = _resolve(args)
    report = render_paper(registry, results_dir=results, out_dir=args.out, templates_dir=args.templates,
                          profile=profile, strict=args.strict)
    for target, missing in report.missing.items():
        claimed = [m for m in missing if m in report.claimed]
        if claimed:
            shown = ", ".join(claimed[:6]) + (f", ... ({len(claimed)} in all)" if len(claimed) > 6 else "")
            print(f"{target}: ?? for {shown}", file=sys.stderr)
    print(report.summary(), file=sys.stderr)
    print(report.tables_summary(registry.captioned_tables()), file=sys.stderr)
    if report.figures is not None:
        for fig in report.figures.placeholders:
            print(f"figures/{fig.name}: missing-data placeholder ({fig.placeholder})", file=sys.stderr)
        print(report.figures.summary(), file=sys.stderr)
    figure_files = [p for p in report.outputs if p.parent == args.out / "figures"]
    print(f"wrote {len(report.outputs) - len(figure_files)} files under {args.out}"
          + (f", and {len(figure_files)} under {args.out / 'figures'}" if figure_files else ""))
    return 0


def cmd_directions(args: argparse.Namespace) -> int:
    from mistill.repro import directions
    from mistill.repro.stage_times import replace_in_readme

    profile, results = _resolve(args)
    rows = directions.read_direction_rows(".", profile, results)
    if args.readme:
        replace_in_readme(args.readme, directions.readme_block(rows, profile), directions.README_BEGIN,
                          directions.README_END)
        print(f"{args.readme}: direction table rewritten ({len(rows)} keys)")
    elif args.markdown:
        print(directions.readme_block(rows, profile))
    else:
        print(directions.text_listing(rows, profile))
    return 0


def cmd_registry_md(args: argparse.Namespace) -> int:
    from mistill.repro.registry import load_registry
    from mistill.repro.registry_md import registry_md_is_current, write_registry_md

    registry = load_registry()
    if args.check:
        if registry_md_is_current(registry):
            print("REGISTRY.md is current")
            return 0
        print("REGISTRY.md is stale: run `mistill repro registry-md`", file=sys.stderr)
        return 1
    path = write_registry_md(registry)
    print(f"wrote {path}")
    return 0


def cmd_bless(args: argparse.Namespace) -> int:
    from mistill.repro.bless import bless
    from mistill.repro.registry import load_registry
    from mistill.repro.registry_md import write_registry_md

    registry = load_registry()
    profile, results = _resolve(args)
    blessing = bless(registry, args.ids, profile=profile, results_dir=results, accept_breach=args.accept_breach)
    for line in blessing.changes:
        print(line)
    for rid, breached in blessing.accepted.items():
        print(f"{rid}: accepted {len(breached)} breach(es) ({args.accept_breach}), recorded in its provenance")
    print(f"blessed {', '.join(args.ids)} into results/expected/{profile}.yaml "
          f"({len(blessing.changes)} values changed)")
    write_registry_md(registry)     # REGISTRY.md shows the goldens: keep it current
    return 0


__all__ = ["UserError", "register"]


def cmd_read(args: argparse.Namespace) -> int:
    """Run a reader script in this interpreter, so DVC stages need no `python` on PATH."""
    import runpy

    from mistill.repro.registry import load_registry

    registry = load_registry()
    if args.id not in registry.results:
        raise UserError(f"unknown result id {args.id!r}")
    reader = Path(registry.results[args.id].reader.split()[0])
    if not reader.is_file():
        raise UserError(f"{args.id}: reader {reader} does not exist (status {registry.results[args.id].status})")
    sys.argv = [str(reader), *args.reader_args]
    try:
        runpy.run_path(str(reader), run_name="__main__")
    except SystemExit as done:
        return int(done.code or 0) if not isinstance(done.code, str) else 1
    return 0
