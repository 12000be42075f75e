"""The readers on the passes' artifacts: registry keys written, the rest reported (R-C1..R-C4)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reader_root(tmp_path_factory, world, qwen_model, tokenizer):
    """A repository root holding the registry, a params.yaml pointing at the test world, and its HD-001."""
    from mistill.instrument.isolation import run_isolation
    from tests.instrument.conftest import write_proxy_rows

    tmp_path, cfg, params, *_ = world
    root = tmp_path_factory.mktemp("root")
    shutil.copy(ROOT / "registry.yaml", root / "registry.yaml")
    shutil.copytree(ROOT / "results" / "expected", root / "results" / "expected")
    all_params = yaml.safe_load((ROOT / "params.yaml").read_text())
    demo = all_params["demo"]
    demo["instrument"]["out_dir"] = str(Path(cfg.out_dir))
    # the world's pass settings and its 2-layer, 4-head model's heads, so the keys are named as the passes ran
    demo["instrument"]["knockin"]["bins"] = list(cfg.bins)
    demo["instrument"]["calibration"].update(pool_k=cfg.pool_k, summary_top_k=cfg.summary_top_k,
                                             recurrence_top_k=cfg.recurrence_top_k)
    demo["instrument"]["selftest"]["selftest_top_k"] = cfg.selftest_top_k
    demo["readers"].update(necessity_k=4, knockin_k=4, layer_ranges=[[0, 0], [1, 1]],
                           importance_share_layers=[[1, 1]],
                           named_heads={"leader": "l1h3", "contrastive_specialist": "l0h2",
                                        "recurrent": ["l0h3", "l1h0"]})
    # the isolation pass (App. D; R-C3) on the world, at sizes within its 8 heads
    demo["isolation"] = {"out_dir": str(tmp_path / "HD-001-isolation"), "bins": [2, 4]}
    run_isolation(cfg, {**params, "isolation": demo["isolation"]}, model=qwen_model, tokenizer=tokenizer)
    # the proxy pass (R-C2's direct-logit attribution), where the readers look for it: beside HD-001
    write_proxy_rows(cfg.out_dir, f"{cfg.out_dir}-proxy")
    (root / "params.yaml").write_text(yaml.safe_dump(all_params))
    return root


def _run(root, reader):
    return subprocess.run([sys.executable, str(ROOT / "readers" / reader)], cwd=root, capture_output=True,
                          text=True)


@pytest.mark.parametrize("reader, rid", [("r_c1.py", "R-C1"), ("r_c2.py", "R-C2"), ("r_c3.py", "R-C3"),
                                         ("r_c4.py", "R-C4")])
def test_readers_write_numbers_files(reader_root, reader, rid):
    done = _run(reader_root, reader)
    assert done.returncode == 0, done.stderr
    numbers = json.loads((reader_root / "results" / f"{rid}.json").read_text())
    assert numbers["id"] == rid and numbers["values"]
    for record in numbers["values"].values():
        assert set(record) >= {"value", "statistic", "artifact"}


def test_r_c1_counts_match_the_events(reader_root, world):
    _, cfg, params, events, *_ = world
    assert _run(reader_root, "r_c1.py").returncode == 0
    values = json.loads((reader_root / "results" / "R-C1.json").read_text())["values"]
    assert values["p1_event_count"]["value"] == events["counts"]["P1"]
    assert values["p2c_event_count"]["value"] == events["counts"]["P2C"]
    assert values["null_event_count"]["value"] == events["counts"]["NULL"]


@pytest.mark.parametrize("reader", ["r_c1.py", "r_c2.py", "r_c3.py", "r_c4.py"])
def test_readers_write_only_keys_they_list(reader_root, reader, monkeypatch):
    from mistill.params import load_params
    from mistill.repro.reader_module import load_reader

    module = load_reader(ROOT / "readers" / reader)
    monkeypatch.chdir(reader_root)
    params = load_params(reader_root / "params.yaml")
    values, _ = module.compute_values(params)
    assert values and set(values) <= set(module.keys(params))
