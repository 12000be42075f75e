"""Artifact-first: publish a pipeline's outputs to the shipped DVC remote, clone without artifacts, pull,
find every stage up to date, and rebuild the paper from numbers files without loading a model.

The project is this repository's own reader stages (R-C1..R-C4 of dvc.yaml, verbatim) over the
instrument test world's HD-001 (and a copy of it as HD-002), tracked with `dvc add`.  The remote is
the one `.dvc/config` ships (`~/.cache/mistill-repro/dvc-remote`), under a temporary HOME.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
READER_STAGES = ("R-C1", "R-C2", "R-C3", "R-C4")
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.org", "-c", "commit.gpgsign=false"]

# Loaded first by every Python process that has its directory on PYTHONPATH: no model, no torch.
MODEL_GUARD = '''
import importlib.abc
import sys

class _NoModelLoads(importlib.abc.MetaPathFinder):
    BLOCKED = ("torch", "transformers", "vllm", "safetensors", "mistill.models")

    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in self.BLOCKED):
            raise ImportError(f"model guard: {name} imported by a command that must read numbers files only")
        return None

sys.meta_path.insert(0, _NoModelLoads())
'''


def _run(args, cwd, env, check=True):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def _dvc(*args):
    return [sys.executable, "-m", "dvc", *args]


def _mistill(*args):
    return [sys.executable, "-m", "mistill.cli", *args]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    bin_dir = str(Path(sys.executable).parent)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "DVC_", "GIT_"))}
    return {**environ, "HOME": str(home), "DVC_NO_ANALYTICS": "1", "GIT_CONFIG_NOSYSTEM": "1",
            "PATH": f"{bin_dir}{os.pathsep}{environ.get('PATH', '')}"}


@pytest.fixture(scope="module")
def project(tmp_path_factory, world, env, qwen_model, tokenizer):
    """A git + DVC project: the reader stages of dvc.yaml, HD-001/HD-002, HD-001-isolation and HD-001-proxy under
    `dvc add`, reproduced."""
    from mistill.instrument.isolation import run_isolation
    from tests.instrument.conftest import write_proxy_rows

    _, cfg, params, *_ = world
    proj = tmp_path_factory.mktemp("publish") / "project"
    proj.mkdir()
    for rel in ("registry.yaml", "readers", "results/expected", "paper/templates", ".dvcignore",
                "src/mistill/instrument/readout.py", "src/mistill/instrument/proxy_readout.py",
                "src/mistill/repro/numbers.py", "src/mistill/models/planted.py"):
        src, dst = ROOT / rel, proj / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    for hd in ("HD-001", "HD-002"):
        shutil.copytree(cfg.out_dir, proj / "artifacts" / hd)
    isolation = {"out_dir": "artifacts/HD-001-isolation", "bins": [2, 4]}   # the isolation pass (R-C3)
    run_isolation(cfg, {**params, "isolation": {**isolation, "out_dir": str(proj / isolation["out_dir"])}},
                  model=qwen_model, tokenizer=tokenizer)
    write_proxy_rows(cfg.out_dir, proj / "artifacts" / "HD-001-proxy")   # R-C2's direct-logit attribution

    all_params = yaml.safe_load((ROOT / "params.yaml").read_text())
    demo = all_params["demo"]
    demo["instrument"]["out_dir"] = "artifacts/HD-001"
    demo["isolation"] = isolation
    demo["instrument"]["knockin"]["bins"] = list(cfg.bins)
    demo["instrument"]["calibration"].update(pool_k=cfg.pool_k, summary_top_k=cfg.summary_top_k,
                                             recurrence_top_k=cfg.recurrence_top_k)
    demo["instrument"]["selftest"]["selftest_top_k"] = cfg.selftest_top_k
    demo["distill"]["teacher_head_sets"] = "artifacts/HD-002/head_sets_contrast.json"
    demo["readers"].update(necessity_k=4, knockin_k=4, layer_ranges=[[0, 0], [1, 1]],
                           importance_share_layers=[[1, 1]],
                           named_heads={"leader": "l1h3", "contrastive_specialist": "l0h2",
                                        "recurrent": ["l0h3", "l1h0"], "region_readers": ["l0h1", "l1h2"],
                                        "prose_readers": ["l1h0"], "contrastive_readers": ["l0h2", "l1h3"]})
    all_params["profile"] = demo
    (proj / "params.yaml").write_text(yaml.safe_dump(all_params, sort_keys=False))

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    (proj / "dvc.yaml").write_text(yaml.safe_dump({"stages": {s: stages[s] for s in READER_STAGES}},
                                                  sort_keys=False))
    (proj / ".gitignore").write_text("/paper/build/\n")

    _run(GIT + ["init", "-q"], proj, env)
    _run(_dvc("init", "-q"), proj, env)
    shutil.copy(ROOT / ".dvc" / "config", proj / ".dvc" / "config")     # the shipped remote, as shipped
    _run(_dvc("add", "-q", "artifacts/HD-001", "artifacts/HD-002", "artifacts/HD-001-isolation",
                   "artifacts/HD-001-proxy"), proj, env)
    _run(_dvc("repro", "-q"), proj, env)
    return proj


def test_publish_then_clone_pull_status_and_render_without_a_model(project, env, tmp_path):
    home_remote = Path(env["HOME"]) / ".cache" / "mistill-repro" / "dvc-remote"
    for rid in READER_STAGES:
        assert json.loads((project / "results" / f"{rid}.json").read_text())["id"] == rid
    _run(_mistill("repro", "render", "--out", "paper/build"), project, env)

    published = _run(_mistill("repro", "publish"), project, env)
    assert "local            private   artifacts/HD-001  (artifacts/HD-001.dvc)" in published.stdout
    assert "results/R-C1.json  (R-C1; cache: false, committed with the code)" in published.stdout
    assert any(home_remote.rglob("*")), "nothing reached the shipped local remote"

    _run(GIT + ["add", "-A"], project, env)
    _run(GIT + ["commit", "-q", "-m", "reader stages, reproduced"], project, env)
    clone = tmp_path / "clone"
    _run(GIT + ["clone", "-q", str(project), str(clone)], tmp_path, env)
    assert not (clone / "artifacts" / "HD-001").exists() and not (clone / ".dvc" / "cache").exists()

    _run(_dvc("pull", "-q"), clone, env)
    status = _run(_dvc("status"), clone, env)
    assert "Data and pipelines are up to date." in status.stdout, status.stdout
    assert filecmp.dircmp(project / "artifacts" / "HD-001", clone / "artifacts" / "HD-001").diff_files == []

    # Every numbers file is a DVC metric: its scalar values are listed by `dvc metrics show`.
    metrics = json.loads(_run(_dvc("metrics", "show", "--json"), clone, env).stdout)[""]["data"]
    for rid in READER_STAGES:
        shown = metrics[f"results/{rid}.json"]["data"]["values"]
        scalars = {k for k, r in json.loads((clone / "results" / f"{rid}.json").read_text())["values"].items()
                   if not isinstance(r["value"], list)}
        assert scalars and {k for k, r in shown.items() if "value" in r} == scalars

    # Render under a guard that makes any model, torch or transformers import fail.
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(MODEL_GUARD)
    guarded = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(guard), env.get("PYTHONPATH")]))}
    blocked = _run([sys.executable, "-c", "import transformers"], clone, guarded, check=False)
    assert blocked.returncode != 0 and "model guard" in blocked.stderr
    _run(_mistill("repro", "render", "--out", "paper/build"), clone, guarded)

    built = sorted(p.relative_to(project / "paper" / "build") for p in (project / "paper" / "build").rglob("*")
                   if p.is_file())
    assert any(p.parts[0] == "tables" for p in built) and any(p.suffix == ".png" for p in built)
    for rel in built:
        assert (clone / "paper" / "build" / rel).read_bytes() == (project / "paper" / "build" / rel).read_bytes(), rel
