"""Helpers shared by the spine's tests: repository paths and hand-written numbers files."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from mistill.repro.registry import Registry

REPO = Path(__file__).resolve().parents[2]


def copy_pipeline(dst: Path, src: Path = REPO) -> None:
    """The pipeline's files (the root dvc.yaml, the pipelines' dvc.yaml files, mistill.repro.pipeline, and the
    family files their family stages run, mistill.repro.families) into `dst`."""
    from mistill.repro.families import family_files
    from mistill.repro.pipeline import pipeline_files

    for name in [*pipeline_files(src), *family_files(src)]:
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / name, dst / name)
SHARED_SPEC = REPO.parent / "shared" / "spec" / "paper_registry.yaml"


def paper_values(registry: Registry, result_id: str, **overrides) -> dict:
    """A full set of values for one result equal to the paper's expected values, some overridden."""
    values = {}
    for key, exp in registry.expected("paper").values[result_id].items():
        value = overrides.pop(key, exp.value)
        values[key] = {"value": value, "statistic": exp.stat, "artifact": "fixture"}
    assert not overrides, f"unknown keys {overrides}"
    return values


def write_fixture(results_dir: Path, result_id: str, values: dict, profile: str = "paper") -> Path:
    """A numbers file written by hand (as a reader would through write_numbers)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{result_id}.json"
    path.write_text(json.dumps({"id": result_id, "profile": profile, "reader": "fixture", "inputs": {},
                                "values": values, "code_version": "test", "params_sha256": "0" * 64}))
    return path


def bless_demo(root: Path, result_id: str, values: dict) -> Path:
    """`values` written as `result_id`'s numbers file under root/results and blessed as its demo goldens;
    returns the demo's expected-values file (results/expected/demo.yaml)."""
    from mistill.cli import main

    results = root / "results"
    write_fixture(results, result_id, values, profile="demo")
    assert main(["repro", "bless", result_id, "--profile", "demo", "--results", str(results)]) == 0
    return results / "expected" / "demo.yaml"


def commit_all(root: Path, *, init: bool = False) -> None:
    """Commit every file under `root` (a throwaway repository; `init` creates it)."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(root), "-c", "user.name=test", "-c", "user.email=test@example.org",
                        "-c", "commit.gpgsign=false", *args], check=True, capture_output=True)
    if init:
        git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "--allow-empty", "-m", "fixture")


def templates_with(root: Path, tables) -> Path:
    """A templates directory under `root` holding the shared layout and only the named table templates (no figure
    specs), so a test renders its tables in a fraction of a second."""
    (root / "tables").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "paper" / "templates" / "_layout.j2", root / "_layout.j2")
    for name in tables:
        shutil.copy(REPO / "paper" / "templates" / "tables" / f"{name}.j2", root / "tables" / f"{name}.j2")
    return root


def md_cells(line: str) -> list[str]:
    """The cells of one rendered Markdown table line, label first (a `\\|` inside a cell is not a border)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def md_table(text: str) -> dict[str | None, dict[str, list[str]]]:
    """Section title -> {row label: [cells after the label]} of a rendered Markdown table; rows before the first
    section (the header among them) sit under None.  A label twice in one section is an error."""
    sections: dict[str | None, dict[str, list[str]]] = {}
    current: str | None = None
    for line in text.splitlines():
        if not line.startswith("| "):
            continue
        cells = md_cells(line)
        if cells[0].startswith("***"):
            current = cells[0].strip("*")
            sections.setdefault(current, {})
            continue
        rows = sections.setdefault(current, {})
        assert cells[0] not in rows, f"two rows {cells[0]!r} in section {current!r}"
        rows[cells[0]] = cells[1:]
    return sections


def minus_sign(text: str) -> str:
    """A number as the markdown tables print it: a negative one with the minus sign, not a hyphen."""
    return "−" + text[1:] if text.startswith("-") else text
