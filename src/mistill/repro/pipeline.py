"""The pipeline's files, and how DVC addresses a stage in them.

The stages live in several `dvc.yaml` files: the root one (the world, the teacher's traces, the
characterization, every result's reader) and one per distillation family under `pipelines/`
(`distill`, `evaluate`, `own-heads`), whose stages run in the repository root (`wdir: ../..`) like
the root's.  The reason is DVC's cost per stage: after every stage it runs, DVC parses and rewrites
that stage's whole `dvc.lock` with its round-trip YAML loader, so one lock for all stages made a full
run's time between stages grow with the square of the stage count (treeverse/dvc#10629).  Split in
four, a lock is about a quarter of the size (`benchmarks/bench_dvc_overhead.py` measures the gain).

A stage of the root file is addressed by its name (`dvc repro R-D6`), one of a family file by the
file and the name (`dvc repro pipelines/distill/dvc.yaml:DT-000`); `DVC_STAGE` carries the same.
`dvc repro` with no target reproduces the root file's stages and everything upstream of them; the
few stages no reader reads are reached by naming every pipeline file (`nox -s repro` does).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from mistill.errors import UserError

ROOT_PIPELINE = "dvc.yaml"
FAMILY_PIPELINES = "pipelines/*/dvc.yaml"
LOCK_NAME = "dvc.lock"


def pipeline_files(root: str | Path = ".") -> list[Path]:
    """The root dvc.yaml and the family files, relative to `root`; the calibration's own pipeline
    (`calibration/dvc.yaml`, never run by a plain `dvc repro`) is not one of them."""
    root = Path(root)
    families = sorted(p.relative_to(root) for p in root.glob(FAMILY_PIPELINES))
    return [Path(ROOT_PIPELINE), *families]


def lock_files(root: str | Path = ".") -> list[Path]:
    """The dvc.lock beside each pipeline file (present or not), relative to `root`."""
    return [p.with_name(LOCK_NAME) for p in pipeline_files(root)]


def stage_name(address: str) -> str:
    """`pipelines/distill/dvc.yaml:DT-000@qwen-fp32-0` -> `DT-000@qwen-fp32-0`; a root name is itself."""
    return address.rsplit(":", 1)[-1]


def stage_addresses(root: str | Path, names: Iterable[str]) -> dict[str, str]:
    """The DVC target of each stage or stage group (a foreach or matrix stage's name) in `names`.

    A name no pipeline file defines is an error naming it, before any stage has run."""
    from dvc.repo import Repo

    root = Path(root)
    wanted = list(dict.fromkeys(names))
    files = {p.as_posix() for p in pipeline_files(root)}
    found: dict[str, str] = {}
    with Repo(str(root)) as repo:
        for stage in repo.index.stages:
            name = getattr(stage, "name", None)
            path = Path(stage.path).resolve().relative_to(root.resolve()).as_posix() if stage.path else None
            if not name or path not in files:
                continue
            for key in {name, name.split("@")[0]} & set(wanted):
                found[key] = key if path == ROOT_PIPELINE else f"{path}:{key}"
    missing = [n for n in wanted if n not in found]
    if missing:
        raise UserError(f"no stage {', '.join(missing)} in {', '.join(sorted(files))}")
    return {n: found[n] for n in wanted}
