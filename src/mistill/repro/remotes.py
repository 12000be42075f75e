"""Where each stage output is published: the active profile's private and shareable DVC remotes.

docs/design.md "Privacy": under the paper profile no note text, trace text or note identifier may reach the
shareable DVC remote.  The profile's ``remotes`` section of params.yaml names two DVC remotes (as
``.dvc/config`` or ``.dvc/config.local`` defines them) and lists the outputs that may be shared::

    remotes:
      private: mimic-private        # every cached output not listed below: notes, traces, per-note
                                    # artifacts (named by note id), generations, targets, weights
      shareable: shareable          # the numbers-only outputs listed here
      shareable_outputs:            # dvc.yaml / .dvc output paths (or globs over them)
        - artifacts/data/shortlists_recall.json

An output is private unless listed: a new output never goes to the shareable remote by accident.
``mistill repro publish`` lists every cached output of the pipeline (``cache: false`` outputs, such
as the numbers files and the committed demo models, live in git and are never pushed), checks the
shareable ones with the privacy guard (their files' contents and their file names, which a
directory's manifest on the remote lists) and refuses to push anything if the guard finds a leak,
then runs ``dvc push -r <remote> <outputs>`` once per remote.  ``--dry-run`` prints the plan.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mistill.errors import UserError
from mistill.repro.privacy import Finding, run_privacy

SETTINGS = ("private", "shareable", "shareable_outputs")
PRIVATE, SHAREABLE = "private", "shareable"


@dataclass(frozen=True)
class RemoteSettings:
    """The active profile's `remotes` section."""

    private: str
    shareable: str
    shareable_outputs: tuple[str, ...] = ()

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RemoteSettings:
        where = f"params.yaml: {params.get('profile', '?')}.remotes"
        section = params.get("remotes")
        if not isinstance(section, Mapping):
            raise UserError(f"{where}: missing; name the profile's DVC remotes ({', '.join(SETTINGS)}; README "
                            "\"Remotes\")")
        unknown = sorted(set(section) - set(SETTINGS))
        if unknown:
            raise UserError(f"{where}: unknown setting {unknown[0]!r} (known: {', '.join(SETTINGS)})")
        names = {}
        for key in (PRIVATE, SHAREABLE):
            value = section.get(key)
            if not isinstance(value, str) or not value:
                raise UserError(f"{where}.{key} must name a DVC remote")
            names[key] = value
        outputs = section.get("shareable_outputs") or []
        if not isinstance(outputs, list) or not all(isinstance(p, str) and p for p in outputs):
            raise UserError(f"{where}.shareable_outputs must be a list of output paths or globs")
        return cls(names[PRIVATE], names[SHAREABLE], tuple(p.rstrip("/") for p in outputs))

    def classify(self, output: str) -> str:
        """PRIVATE or SHAREABLE: shareable only when a listed path or glob names the output."""
        output = output.rstrip("/")
        return SHAREABLE if any(fnmatch.fnmatchcase(output, pattern) for pattern in self.shareable_outputs) \
            else PRIVATE

    def remote(self, kind: str) -> str:
        return self.shareable if kind == SHAREABLE else self.private


@dataclass(frozen=True)
class StageOutput:
    stage: str           # the stage's address in its pipeline file (or the .dvc file)
    path: str            # as declared, relative to the repository root
    cached: bool         # false: `cache: false`, kept in git
    built: bool          # recorded in dvc.lock (or the .dvc file) with a hash


def stage_outputs(root: str | Path = ".") -> list[StageOutput]:
    """Every output of the pipeline (every pipeline file's stages, foreach/matrix expanded, and .dvc files)."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    try:
        with Repo(str(root)) as repo:
            # a .dvc file's output is declared relative to the file's directory: name it from the root
            outs = [StageOutput(out.stage.addressing, Path(os.path.relpath(out.fs_path, repo.root_dir)).as_posix(),
                                bool(out.use_cache), bool(out.hash_info and out.hash_info.value))
                    for out in repo.index.outs]
    except DvcException as err:
        raise UserError(f"{root}: cannot list the pipeline's outputs ({err})") from None
    return sorted(outs, key=lambda o: o.path)


def configured_remotes(root: str | Path = ".") -> set[str]:
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return set(repo.config.get("remote", {}))


@dataclass
class PublishPlan:
    settings: RemoteSettings
    pushes: dict[str, list[StageOutput]] = field(default_factory=dict)      # remote -> outputs
    kinds: dict[str, str] = field(default_factory=dict)                     # output path -> PRIVATE/SHAREABLE
    in_git: list[StageOutput] = field(default_factory=list)                 # cache: false
    not_built: list[StageOutput] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        for remote, outputs in self.pushes.items():
            for o in outputs:
                out.append(f"{remote:<16} {self.kinds[o.path]:<9} {o.path}  ({o.stage})")
        out += [f"{'(git)':<16} {'':<9} {o.path}  ({o.stage}; cache: false, committed with the code)"
                for o in self.in_git]
        out += [f"{'(skipped)':<16} {'':<9} {o.path}  ({o.stage} has not run: not in dvc.lock)"
                for o in self.not_built]
        return out


def plan_publish(settings: RemoteSettings, outputs: list[StageOutput], targets: list[str] | None = None) -> PublishPlan:
    """Which remote each cached, built output goes to (only `targets`' outputs when given)."""
    plan = PublishPlan(settings)
    wanted = [t.rstrip("/") for t in targets or []]
    for out in outputs:
        if wanted and not any(out.path == t or out.stage == t or out.path.startswith(t + "/") for t in wanted):
            continue
        if not out.cached:
            plan.in_git.append(out)
            continue
        if not out.built:
            plan.not_built.append(out)
            continue
        kind = settings.classify(out.path)
        plan.kinds[out.path] = kind
        plan.pushes.setdefault(settings.remote(kind), []).append(out)
    return plan


def shareable_paths(settings: RemoteSettings, outputs: list[StageOutput]) -> list[str]:
    """The cached outputs that the settings send to the shareable remote."""
    return [o.path for o in outputs if o.cached and settings.classify(o.path) == SHAREABLE]


def check_shareable(params: Mapping[str, Any], root: str | Path = ".", outputs: list[StageOutput] | None = None):
    """The privacy guard over every output classified shareable, as it stands in the workspace.

    Returns the privacy report (`mistill.repro.privacy.PrivacyReport`); a shareable output absent
    from the workspace cannot be checked and is reported as a finding, so it is never pushed unchecked.
    """
    root = Path(root)
    settings = RemoteSettings.from_params(params)
    outputs = stage_outputs(root) if outputs is None else outputs
    paths = shareable_paths(settings, outputs)
    present = [p for p in paths if (root / p).exists()]
    report = run_privacy(params, [root / p for p in present], root=root, names=True)
    for p in paths:
        if p not in present and any(o.path == p and o.built for o in outputs):
            report.findings.append(Finding(Path(p), "the output", "absent from the workspace, cannot be checked",
                                           "dvc checkout or dvc pull it first"))
    report.notes.append(f"shareable outputs ({settings.shareable}): {len(paths)} listed, {len(present)} present")
    return report


def publish(params: Mapping[str, Any], *, root: str | Path = ".", targets: list[str] | None = None,
            dry_run: bool = False, jobs: int | None = None) -> PublishPlan:
    """Push every cached output to its remote; refuse if the shareable ones fail the privacy guard."""
    root = Path(root)
    settings = RemoteSettings.from_params(params)
    outputs = stage_outputs(root)
    plan = plan_publish(settings, outputs, targets)
    for line in plan.lines():
        print(line)
    known = configured_remotes(root)
    for remote in dict.fromkeys([settings.private, settings.shareable]):
        if remote not in known:
            raise UserError(f"DVC remote {remote!r} (params.yaml {params.get('profile', '?')}.remotes) is not "
                            f"configured: `dvc remote add {remote} <url>` (README \"Remotes\"; known: "
                            f"{', '.join(sorted(known)) or 'none'})")
    if any(kind == SHAREABLE for kind in plan.kinds.values()):
        report = check_shareable(params, root, outputs)
        for note in report.notes:
            print(f"privacy: {note}")
        if report.findings:
            for finding in report.findings:
                print(finding.format(), file=sys.stderr)
            raise UserError(f"publish: {len(report.findings)} privacy finding(s) in outputs listed as shareable "
                            f"(params.yaml {params.get('profile', '?')}.remotes.shareable_outputs): nothing pushed")
        print(report.summary())
    if dry_run:
        print("dry run: nothing pushed")
        return plan
    for remote, outs in plan.pushes.items():
        command = [sys.executable, "-m", "dvc", "push", "-r", remote, *(["-j", str(jobs)] if jobs else []),
                   *[o.path for o in outs]]
        print("$ dvc " + " ".join(command[3:]))
        done = subprocess.run(command, cwd=root)
        if done.returncode != 0:
            raise UserError(f"publish: `dvc push -r {remote} ...` failed (exit {done.returncode})")
    if not plan.pushes:
        print("publish: no built output to push")
    return plan


# ---- `mistill repro publish` ------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction) -> None:
    sub = subparsers.add_parser(
        "publish", help="push every cached stage output to the profile's private or shareable DVC remote",
        description=__doc__.splitlines()[0])
    sub.add_argument("targets", nargs="*", metavar="TARGET",
                     help="only these outputs, output directories or stage names (default: every output)")
    sub.add_argument("--dry-run", action="store_true", help="print where each output would go; push nothing")
    sub.add_argument("-j", "--jobs", type=int, help="parallel transfers (dvc push -j)")
    sub.set_defaults(func=cmd_publish)


def cmd_publish(args: argparse.Namespace) -> int:
    from mistill.params import load_params

    publish(load_params(), targets=args.targets, dry_run=args.dry_run, jobs=args.jobs)
    return 0
