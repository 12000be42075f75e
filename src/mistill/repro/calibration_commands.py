"""`mistill repro calibrate run | apply | machine`: the replicates' runs, their tolerances written into the
expected values, and a second machine's run marked (`mistill.repro.calibration`, `mistill.repro.second_machine`;
docs/tolerances.md)."""

from __future__ import annotations

from pathlib import Path

from mistill.repro.calibration import (
    README_BEGIN,
    README_END,
    SPREAD_FILE,
    apply_calibration,
    findings_table,
    measure_spreads,
    remark_from_expected,
    rewrite_value_checks,
    write_spreads,
)
from mistill.repro.check import run_check
from mistill.repro.registry import Registry
from mistill.repro.second_machine import cmd_machine
from mistill.repro.stage_times import replace_in_readme


def register(subparsers) -> None:
    """`mistill repro calibrate run | apply | machine`."""
    cal = subparsers.add_parser("calibrate", help="tolerances from replicates of the distillation chain",
                                description="run: rerun the chain once per replicate (params calibration) and "
                                "write <out>/spread.json (the stage CAL of calibration/dvc.yaml runs this); "
                                "apply: write the calibrated tolerances into results/expected/<profile>.yaml")
    verbs = cal.add_subparsers(dest="verb", required=True)
    run = verbs.add_parser("run", help="run the replicates not yet done, then measure the spreads")
    run.set_defaults(func=cmd_run)
    apply = verbs.add_parser("apply", help="write the calibrated tolerances into the profile's expected values")
    apply.add_argument("--spreads", type=Path, help="spread file (default: <calibration.out>/spread.json)")
    apply.add_argument("--doc", type=Path, nargs="?", const=Path("docs/tolerances.md"), default=None, metavar="PATH",
                       help="also rewrite the findings table between its markers in docs/tolerances.md (or PATH)")
    apply.add_argument("--marks-only", action="store_true",
                       help="derive the calibrated values' marks again from the expected values alone, as after "
                            "a re-bless: null intervals, and descriptive where a kept tolerance reaches zero from "
                            "the golden (marks are added, never removed; no spread file, no tolerance changes)")
    apply.set_defaults(func=cmd_apply)
    machine = verbs.add_parser("machine", help="mark the values a run on another machine moved that no replicate "
                               "measured (second_machine.py)")
    machine.add_argument("run", type=Path, help="the run's directory: machine.yaml and results/R-*.json")
    machine.add_argument("--dry-run", action="store_true", help="print what would be marked, write nothing")
    machine.add_argument("--doc", type=Path, nargs="?", const=Path("docs/tolerances.md"), default=None, metavar="PATH",
                         help="also rewrite the per-result table of how values are checked in docs/tolerances.md "
                              "(or PATH)")
    machine.set_defaults(func=cmd_machine)


def cmd_run(args) -> int:
    from mistill.params import load_params
    from mistill.repro.registry import load_registry
    from mistill.repro.replicates import CalibrationConfig, run_replicates

    params = load_params()
    config = CalibrationConfig.from_params(params)
    registry = load_registry()
    done = run_replicates(Path("."), config, config.replicates)
    elsewhere = [r.name for r in config.replicates if r.name not in done]
    if not elsewhere:
        dirs = [done[r.name] for r in config.replicates]
        spreads = measure_spreads(registry, params["profile"], dirs, config.results, config.reference)
        write_spreads(config.out / SPREAD_FILE, spreads, dirs, config.family_alpha, config.reference)
        moved = sum(1 for s in spreads if s.spread > 0)
        print(f"{len(dirs)} replicates; {moved} of {len(spreads)} values moved; wrote {config.out / SPREAD_FILE}")
    if config.held_out:     # checked, not measured: they need not hold the spreads up, and take an idle process
        run_replicates(Path("."), config, config.held_out)
    if elsewhere:
        print(f"{', '.join(elsewhere)}: running in other processes; the last of them to finish measures the "
              "spreads (or rerun `mistill repro calibrate run` once they have ended)")
    return 0


def cmd_apply(args) -> int:
    from mistill.params import load_params
    from mistill.repro.registry import load_registry
    from mistill.repro.registry_md import write_registry_md
    from mistill.repro.replicates import CalibrationConfig

    params = load_params()
    config = CalibrationConfig.from_params(params)
    registry = load_registry()
    if args.marks_only:
        calibrated = remark_from_expected(registry, params["profile"])
        for c in calibrated:
            print(f"{c.result_id}.{c.key}: " + ("null interval (checked for containing 0)" if c.null_interval
                                               else f"descriptive in {c.range} (its tolerance reaches zero)"))
        print(f"marked {sum(c.null_interval for c in calibrated)} null intervals and "
              f"{sum(c.descriptive for c in calibrated)} values descriptive in "
              f"results/expected/{params['profile']}.yaml")
        write_registry_md(registry)
        if args.doc is not None:
            registry = load_registry()
            _rewrite_doc(args.doc, registry, params["profile"], config.results)
            rewrite_value_checks(args.doc, registry, params["profile"])
        return 0
    calibrated = apply_calibration(registry, params["profile"], args.spreads or config.out / SPREAD_FILE)
    for c in calibrated:
        tol = f"±{c.tolerance:g}" if c.tolerance is not None else "class tolerance kept"
        marks = (", null interval" if c.null_interval else "") + (f", descriptive in {c.range}" if c.descriptive else "")
        print(f"{c.result_id}.{c.key}: {tol}{marks}")
    descriptive = sum(c.descriptive for c in calibrated)
    print(f"calibrated {sum(c.tolerance is not None for c in calibrated)} tolerances, {descriptive} values "
          f"descriptive in "
          f"results/expected/{params['profile']}.yaml")
    # The tests of the tolerances: runs they were not measured on. A held-out replicate brings a perturbation
    # of its own; the reference run, when the replicates ran away from the goldens' machine, is another CPU.
    unseen = [(f"held out {rep.name} ({rep.describe()})", config.out / rep.name) for rep in config.held_out]
    if config.reference is not None:
        unseen.append((f"the reference run {config.reference} (the replicates' CPU, not the goldens')",
                       config.reference))
    failed = False
    for name, directory in unseen:
        if not directory.is_dir():
            print(f"{name}: not run (dvc repro calibration/dvc.yaml)")
            continue
        failed |= breaches(registry, params["profile"], name, directory, config.results)
    write_registry_md(registry)
    if args.doc is not None:
        _rewrite_doc(args.doc, registry, params["profile"], config.results)
    return 1 if failed else 0


def breaches(registry: Registry, profile: str, name: str, directory: Path, results: tuple[str, ...]) -> bool:
    """Check a run's numbers files against the expected values, print the summary and each failed value;
    whether any failed."""
    report = run_check(registry, profile, directory, list(results))
    print(f"{name}: {report.summary()}")
    for line in report.lines:
        if line.fails:
            print(f"  {line.result_id}.{line.key}: {line.verdict} {line.detail}")
    return report.failed


def _rewrite_doc(doc: Path, registry: Registry, profile: str, results: tuple[str, ...]) -> None:
    replace_in_readme(doc, findings_table(registry, profile, results), README_BEGIN, README_END)
    print(f"rewrote the findings table in {doc}")
