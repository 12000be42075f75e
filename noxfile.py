"""Sessions: `nox -s tests | slow | rehearsal | check_tolerances | paper | repro | mutants | bench | bench_chain | lint`.

Every session runs in the active environment (no virtualenv of its own, no
network): set it up once with `pip install -e '.[dev]'`.  Arguments after `--`
pass through, e.g. `nox -s check_tolerances -- R-D6`.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

import nox

nox.options.default_venv_backend = "none"
# Sessions run the tools of the interpreter that runs nox (`.venv/bin/nox` works without
# activating the environment first).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
nox.options.sessions = ["tests"]


@nox.session
def tests(session: nox.Session) -> None:
    """The fast suite (pyproject's addopts exclude slow and gpu tests)."""
    session.run("pytest", *session.posargs)


@nox.session
def slow(session: nox.Session) -> None:
    """Only the slow tests (simulations, demo training)."""
    session.run("pytest", "-m", "slow", *session.posargs)


@nox.session
def rehearsal(session: nox.Session) -> None:
    """The paper profile rehearsed on stand-ins (tests/rehearsal): `mistill rehearsal build` in a temporary
    directory, then `dvc repro` of its targets under it (`mistill.rehearsal.build.TARGETS`: every arm at seeds 0-2, the MIMIC-IV loader,
    vLLM, YaRN, pinned revisions), `mistill repro check` and the privacy guard.  To keep the working copy:
    `mistill rehearsal build <dir>` and the command it prints."""
    session.run("pytest", "-m", "slow", "--durations=5", "tests/rehearsal", *session.posargs)


@nox.session
def check_tolerances(session: nox.Session) -> None:
    """Every numbers file against its profile's expected values (`-- R-D6 ...` restricts to ids), then
    the privacy guard over results/ and paper/build/."""
    session.run("mistill", "repro", "check", *session.posargs)
    session.run("mistill", "repro", "privacy")


@nox.session
def paper(session: nox.Session) -> None:
    """Rebuild paper/build (tables and macros) from results/ (`-- --strict` fails on a missing number),
    then the privacy guard over results/ and paper/build/."""
    session.run("mistill", "repro", "render", *session.posargs)
    session.run("mistill", "repro", "privacy")


@nox.session
def repro(session: nox.Session) -> None:
    """The demo end to end: `dvc repro` (every pipeline file's stages, or the ids given), the checks, the paper,
    the privacy guard.  Naming every pipeline file (mistill.repro.pipeline) also runs the few stages no
    result's reader reads, which a bare `dvc repro` (the root dvc.yaml and what it depends on) leaves."""
    from mistill.repro.pipeline import pipeline_files

    ids = list(session.posargs)
    # one warm interpreter forks every stage's `mistill`, so no stage pays for importing torch (mistill.warm);
    # and DVC neither rewrites a whole dvc.lock nor re-reads params.yaml for every stage (mistill.repro.dvc_run)
    session.run("mistill", "repro", "warm", "python", "-m", "mistill.repro.dvc_run", "repro",
                *(ids or [p.as_posix() for p in pipeline_files()]))
    session.run("mistill", "repro", "check", *ids)
    session.run("mistill", "repro", "render")
    session.run("mistill", "repro", "privacy")


@nox.session
def mutants(session: nox.Session) -> None:
    """The recipe with one link broken (params mutants.runs: the attention term off, random heads, targets of other
    notes, the layer map shifted by one), each checked; the record in benchmarks/results/mutants_demo.json (`-- NAME
    ...` runs those only). Needs the demo's artifacts (`nox -s repro` first); about 5 to 15 minutes a mutant on two cores."""
    session.run("mistill", "repro", "mutants", "--record", "benchmarks/results/mutants_demo.json", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmarks/bench_*.py, one after another."""
    scripts = sorted(glob.glob("benchmarks/bench_*.py"))
    if not scripts:
        session.log("no benchmarks/bench_*.py yet")
    for script in scripts:
        session.run("python", script, *session.posargs)


@nox.session
def bench_chain(session: nox.Session) -> None:
    """Two commits' demo chains side by side: per-stage times and ratios (`-- --old REV [--new REV]`)."""
    session.run("python", "benchmarks/chain_side_by_side.py", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.run("ruff", "check", "src", "tests", "readers", "tools", "noxfile.py", *session.posargs)


@nox.session
def publish(session: nox.Session) -> None:
    """Push every cached stage output to the active profile's DVC remotes (`dvc push`): the demo's default
    local remote, or under the paper profile the private and shareable remotes params.yaml names, after the
    privacy guard has checked the shareable outputs (`-- --dry-run` prints the plan; docs/remotes.md)."""
    session.run("mistill", "repro", "publish", *session.posargs)
