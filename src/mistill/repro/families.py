"""A family of stages run as one DVC stage: every item in one `dvc repro` step, each rerun only when its own
inputs change (`mistill repro family FILE NAME`).

DVC pays a fixed cost for each stage it runs (checking it, hashing and caching its outputs, recording it), and
the demo's matrix families (the recipe-variant grid, the per-arm evaluations and own-heads chains) are most of
its stages. A family file holds such foreach/matrix definitions in dvc.yaml's own syntax, `vars:` included; DVC
never reads it (it reads only files named dvc.yaml), and DVC's own resolver (`dvc.parsing.DataResolver`) expands
it here into items with their commands, dependencies, params and outputs. The pipeline then declares one stage
for the whole family:

    M6-variant:
      wdir: ../..
      cmd: mistill repro family pipelines/own-heads/families.yaml M6-variant
      deps: [the items' dependencies]
      params: [the items' params]
      outs: [the directories that hold the items' outputs, persist: true]

An item runs when its key differs from the one recorded beside its first output (`.<name>.family-key`, inside
the family's output directory): the sha256 of its commands, the values of the params it names and the content
of its dependencies (a file's bytes; a directory's files by relative path and content, DVC's ignored `.*.tmp`
left out). So an edit that touches one item's inputs reruns that item alone, and a rerun after a kill starts
where the kill stopped. An item's commands run as DVC runs a stage's: through the shell, in the item's working
directory, with its name in `DVC_STAGE` (so `mistill repro stage-times` times it as its own row) and its
non-persistent outputs removed first. A failing item stops the family, its key unrecorded.

Items run `compute.family_jobs` at a time (params; default 1), each on `models.threads` threads as alone, so
what an item computes does not depend on how many run beside it; side by side, each item's output goes to
its log under `.dvc/tmp/mistill/families/`, and a failing item lets the running ones finish (their keys
recorded) and starts no other. It is meant for machines with more cores than `models.threads`; on the demo's
two cores, two items side by side at one thread each were slower than one after the other at two
(docs/speed.md), and the demo runs one at a time.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from dvc.parsing import DataResolver
from dvc.repo import Repo

from mistill.errors import UserError
from mistill.io import atomic_open
from mistill.params import FAST_SAFE_LOADER

IGNORED = ".*.tmp"   # .dvcignore: the temporary siblings of atomic writes
PARAMS_FILE = "params.yaml"
FAMILY_FILES = "pipelines/*/families.yaml"
LOGS = Path(".dvc/tmp/mistill/families")   # each item's output when items run side by side
# the command of a family stage in a dvc.yaml: `mistill repro family FILE NAME`
FAMILY_COMMAND = re.compile(r"^mistill repro family (?P<file>\S+) (?P<name>\S+)$")


@dataclass(frozen=True)
class FamilyItem:
    """One resolved item: paths relative to the repository root."""

    name: str                        # `M6-variant@nowindow`
    commands: tuple[str, ...]
    wdir: str
    deps: tuple[str, ...]
    params: tuple[str, ...]          # dotted keys of params.yaml
    outs: tuple[tuple[str, bool], ...]   # (path, persist)

    @property
    def key_file(self) -> Path:
        first = Path(self.outs[0][0])
        return first.parent / f".{first.name}.family-key"


def family_items(root: Path, family_file: str, family: str) -> list[FamilyItem]:
    """The items of `family` (a foreach or matrix stage of `family_file`), resolved as DVC resolves dvc.yaml."""
    path = root / family_file
    if not path.is_file():
        raise UserError(f"{family_file}: no family file")
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=FAST_SAFE_LOADER) or {}
    if family not in (data.get("stages") or {}):
        raise UserError(f"{family_file}: no family {family!r} (it defines {', '.join(data.get('stages') or {})})")
    data["stages"] = {family: data["stages"][family]}
    with Repo(str(root)) as repo:
        # an absolute directory: DVC reads `vars` files relative to the process's directory otherwise
        stages = DataResolver(repo, str((root / family_file).resolve().parent), data).resolve()["stages"]
    return [_item(name, definition, Path(family_file).parent) for name, definition in stages.items()]


def _item(name: str, definition: dict, base: Path) -> FamilyItem:
    wdir = os.path.normpath(base / definition.get("wdir", "."))
    commands = definition["cmd"] if isinstance(definition["cmd"], list) else [definition["cmd"]]
    params = []
    for entry in definition.get("params") or []:
        if not isinstance(entry, str):
            raise UserError(f"{name}: a family item names params of {PARAMS_FILE} by key, not {entry!r}")
        params.append(entry)
    outs = []
    for entry in definition.get("outs") or []:
        out, options = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()))
        outs.append((os.path.normpath(Path(wdir) / out), bool((options or {}).get("persist", False))))
    if not outs:
        raise UserError(f"{name}: a family item needs an output (its key is recorded beside the first)")
    deps = tuple(os.path.normpath(Path(wdir) / d) for d in definition.get("deps") or [])
    return FamilyItem(name, tuple(commands), wdir, deps, tuple(params), tuple(outs))


class Digests:
    """Content digests of dependencies, each path hashed once per run (a family's items do not read each other's
    outputs; one that did would only rerun once more, its key taken before the other item changed the input)."""

    def __init__(self, root: Path):
        self.root = root
        self._seen: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        if path not in self._seen:
            self._seen[path] = self._digest(self.root / path, path)
        return self._seen[path]

    @staticmethod
    def _file(path: Path) -> str:
        return hashlib.md5(path.read_bytes()).hexdigest()

    def _digest(self, full: Path, path: str) -> str:
        if full.is_file():
            return self._file(full)
        if not full.is_dir():
            raise UserError(f"{path}: a dependency that does not exist (run the stage that writes it first)")
        files = sorted(p for p in full.rglob("*") if p.is_file() and not fnmatch.fnmatch(p.name, IGNORED))
        listing = "".join(f"{p.relative_to(full).as_posix()}\0{self._file(p)}\n" for p in files)
        return hashlib.md5(listing.encode()).hexdigest() + ".dir"


def param_value(params: dict, dotted: str) -> Any:
    value = params
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise UserError(f"{PARAMS_FILE}: no {dotted}")
        value = value[part]
    return value


def item_key(item: FamilyItem, params: dict, digests: Digests) -> str:
    """The sha256 of what the item computes from: its commands, params and dependencies' content."""
    record = {"commands": item.commands, "wdir": item.wdir,
              "params": {p: param_value(params, p) for p in item.params},
              "deps": {d: digests(d) for d in item.deps}}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def family_jobs(params: dict) -> int:
    """How many items run at a time (params `compute.family_jobs`; 1 when absent)."""
    jobs = int(((params.get("profile") or {}).get("compute") or {}).get("family_jobs") or 1)
    if jobs < 1:
        raise UserError(f"{PARAMS_FILE}: compute.family_jobs must be at least 1, not {jobs}")
    return jobs


def recorded_key(root: Path, item: FamilyItem) -> str | None:
    path = root / item.key_file
    return path.read_text(encoding="utf-8").strip() if path.is_file() else None


def run_item(root: Path, item: FamilyItem, log: Path | None = None) -> None:
    """Run the item's commands (its output to `log` when given, else to this process's)."""
    for out, persist in item.outs:
        target = root / out
        if persist or not (target.exists() or target.is_symlink()):
            continue
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
    env = {**os.environ, "DVC_STAGE": item.name}
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("", encoding="utf-8")
    for command in item.commands:
        if log is None:
            print(f"> {command}", flush=True)
            done = subprocess.run(command, shell=True, cwd=root / item.wdir, env=env)
        else:
            with log.open("a", encoding="utf-8") as fh:
                fh.write(f"> {command}\n")
                fh.flush()
                done = subprocess.run(command, shell=True, cwd=root / item.wdir, env=env, stdout=fh,
                                      stderr=subprocess.STDOUT)
        if done.returncode != 0:
            seen = f" (its output: {log})" if log is not None else ""
            raise UserError(f"{item.name}: `{command}` exited with {done.returncode}{seen}; the family stops "
                            "here, and its next run starts with this item")


def stale_items(root: Path, family_file: str, family: str, only: list[str] | None = None) -> list[str]:
    """The items of `family` (or of `only`) whose inputs changed since they last ran, without running them."""
    return run_family(root, family_file, family, only=only, dry=True, quiet=True)


def run_family(root: Path, family_file: str, family: str, *, only: list[str] | None = None,
               dry: bool = False, quiet: bool = False) -> list[str]:
    """Run the items of `family` whose inputs changed (or `only` these item names); the names run."""
    root = Path(root)
    items = family_items(root, family_file, family)
    if only:
        unknown = sorted(set(only) - {i.name for i in items})
        if unknown:
            raise UserError(f"{family}: no item {', '.join(unknown)}")
        items = [i for i in items if i.name in only]
    params = yaml.load((root / PARAMS_FILE).read_text(encoding="utf-8"), Loader=FAST_SAFE_LOADER)
    jobs = family_jobs(params)
    digests = Digests(root)
    stale = [(item, key) for item in items if recorded_key(root, item) != (key := item_key(item, params, digests))]
    if dry:
        for item, _ in stale if not quiet else ():
            print(f"{item.name}:", *(f"> {c}" for c in item.commands), sep="\n")
    elif jobs == 1 or len(stale) == 1:
        for item, key in stale:
            print(f"Running family item '{item.name}':", flush=True)
            run_item(root, item)
            _record(root, item, key)
    else:
        _run_side_by_side(root, stale, jobs)
    ran = [item.name for item, _ in stale]
    if not quiet:
        print(f"{family}: {len(ran)} of {len(items)} items {'to run' if dry else 'run'}, the rest up to date")
    return ran


def _record(root: Path, item: FamilyItem, key: str) -> None:
    with atomic_open(root / item.key_file, "w", encoding="utf-8") as fh:
        fh.write(key + "\n")


def _run_side_by_side(root: Path, stale: list[tuple[FamilyItem, str]], jobs: int) -> None:
    """`jobs` items at a time, in order; after a failure the running items finish and no other starts."""
    pending = list(stale)
    running: dict = {}
    failure: BaseException | None = None
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while pending or running:
            while pending and len(running) < jobs and failure is None:
                item, key = pending.pop(0)
                log = root / LOGS / f"{item.name}.log"
                print(f"Running family item '{item.name}' (output: {log.relative_to(root)})", flush=True)
                running[pool.submit(run_item, root, item, log)] = (item, key)
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                item, key = running.pop(future)
                if future.exception() is not None:
                    failure = failure or future.exception()
                else:
                    _record(root, item, key)
    if failure is not None:
        raise failure


def family_files(root: str | Path = ".") -> list[Path]:
    """The family files beside the pipeline files, relative to `root` (what a copy of the project needs too)."""
    root = Path(root)
    return sorted(p.relative_to(root) for p in root.glob(FAMILY_FILES))


def family_of(command: str) -> tuple[str, str] | None:
    """(family file, family) of a family stage's command, or None for any other command."""
    match = FAMILY_COMMAND.match(" ".join(str(command).split()))
    return (match["file"], match["name"]) if match else None


def item_command(family_file: str, family: str, item: str) -> str:
    """The command that runs one item of a family alone (and records its key), as the family stage would."""
    return f"mistill repro family {shlex.quote(family_file)} {shlex.quote(family)} --item {shlex.quote(item)}"


@dataclass(frozen=True)
class FamilyStage:
    """A family stage of the pipeline (its DVC stage name) and its resolved items."""

    stage: str
    family_file: str
    family: str
    items: tuple[FamilyItem, ...]

    def command(self, item: FamilyItem) -> str:
        return item_command(self.family_file, self.family, item.name)


def pipeline_families(root: Path, stages) -> dict[str, FamilyStage]:
    """The family stages among DVC's `stages` (objects with `.name` and `.cmd`), by stage name, items resolved."""
    found = {}
    for stage in stages:
        family = family_of(getattr(stage, "cmd", "") or "")
        if family is not None:
            found[stage.name] = FamilyStage(stage.name, family[0], family[1],
                                            tuple(family_items(Path(root), *family)))
    return found
