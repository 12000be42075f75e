"""vLLM data parallel (`models.vllm.data_parallel_size`): one engine per torchrun process, each on its own
GPUs and blind to torchrun's variables while it starts, note n on process n mod N; two processes write
the bytes one process writes, and a killed sharded run resumes from its part files."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from mistill.errors import UserError
from mistill.evaluate.generate_commands import note_seed
from mistill.io import read_jsonl
from mistill.models.trace_rows import ResumableRows
from mistill.models.vllm_backend import generation_processes, replica_environment, replica_gpus
from mistill.shard import Shard
from tests.chain.test_resume import NOTES
from tests.models.conftest import FAKES, write_paper_world

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}


def test_generation_runs_one_process_per_vllm_engine():
    assert generation_processes({"models": {"generation_backend": "transformers",
                                            "vllm": {"data_parallel_size": 4}}}) == 1
    assert generation_processes({"models": {"generation_backend": "vllm", "vllm": {"tensor_parallel_size": 2}}}) == 1
    assert generation_processes({"models": {"generation_backend": "vllm", "vllm": {"data_parallel_size": 3}}}) == 3
    with pytest.raises(UserError, match="invalid settings"):
        generation_processes({"models": {"generation_backend": "vllm", "vllm": {"data_parallel_size": 0}}})


def test_each_engine_takes_its_own_block_of_gpus():
    gpus = ["0", "1", "2", "3", "4", "5"]
    assert [replica_gpus(Shard(r, 3, r), 2, gpus) for r in range(3)] == [["0", "1"], ["2", "3"], ["4", "5"]]
    assert replica_gpus(Shard(1, 2, 1), 1, ["GPU-a", "GPU-b"]) == ["GPU-b"]        # UUIDs as listed
    with pytest.raises(UserError, match=r"data_parallel_size 2 x tensor_parallel_size 2 needs 4 GPUs; 3 visible"):
        replica_gpus(Shard(0, 2, 0), 2, gpus[:3])


def test_an_engine_starts_on_its_gpus_without_torchruns_variables(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    with replica_environment(Shard(1, 2, 1), tensor_parallel_size=2):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
        assert not set(TORCHRUN) & set(os.environ)
    assert {name: os.environ[name] for name in TORCHRUN} == TORCHRUN     # back for the processes' barrier
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"               # a second engine finds the same block
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)         # no list: every GPU of the host
    with replica_environment(Shard(1, 2, 1), tensor_parallel_size=2):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ                      # unset before, unset after
    with replica_environment(Shard(), tensor_parallel_size=2):           # one process: nothing changes
        assert os.environ["RANK"] == "1" and "CUDA_VISIBLE_DEVICES" not in os.environ


def test_a_killed_sharded_run_resumes_from_its_part_files(tmp_path):
    path = tmp_path / "traces.jsonl"
    keys = {f"n{i}": f"key{i}" for i in range(5)}
    rank1 = ResumableRows(path, keys, shard=Shard(1, 2, 1))
    assert rank1.todo() == ["n1", "n3"]                                  # note n on rank n mod 2
    with rank1:
        rank1.add({"note_id": "n1", "text": "one"})                      # then the run is killed
    assert (tmp_path / "traces.jsonl.part1").is_file() and not path.exists()
    rerun = ResumableRows(path, keys)                                    # one process this time
    assert rerun.reused == 1 and rerun.todo() == ["n0", "n2", "n3", "n4"]
    with rerun:
        for note in rerun.todo():
            rerun.add({"note_id": note, "text": note})
    rows = rerun.finish()
    assert [r["note_id"] for r in rows] == list(keys) and rows[1]["text"] == "one"
    assert read_jsonl(path) == rows and not list(tmp_path.glob("*.part*"))
    stale = ResumableRows(path, {**keys, "n1": "another key"})           # a row of other inputs is not reused
    assert stale.todo() == ["n1"]


def _commands(root: Path, cache: str) -> None:
    """`models traces` and `evaluate generate` in this process, then what its engines saw into engines.json."""
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_CACHE = cache
    sys.path.insert(0, str(FAKES))
    import vllm

    from mistill.cli import main

    os.chdir(root)
    assert main(["models", "traces", "--set", "TR-007"]) == 0
    assert main(["evaluate", "generate", "--model", "student_qwen", "--out", "eval/generations.jsonl"]) == 0
    rank = os.environ.get("RANK", "0")
    (root / f"engines{rank}.json").write_text(json.dumps(
        [{"environment": e.environment, "seeds": [p.seed for _, p in e.requests]} for e in vllm.ENGINES]))


def _rank(rank: int, world: int, port: int, root: str, cache: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="0,1")
    _commands(Path(root), cache)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_engines_write_the_bytes_one_engine_writes(tmp_path, paper_models, monkeypatch):
    cache, models = paper_models
    one = write_paper_world(tmp_path / "one", models, test_notes=slice(1, 6), vllm={"data_parallel_size": 1})
    two = write_paper_world(tmp_path / "two", models, test_notes=slice(1, 6), vllm={"data_parallel_size": 2})
    monkeypatch.setattr(sys, "path", list(sys.path))                    # the fake stays out of other tests
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.chdir(tmp_path)
    _commands(one, str(cache))
    sys.modules.pop("vllm", None)
    mp.start_processes(_rank, args=(2, _free_port(), str(two), str(cache)), nprocs=2, start_method="spawn",
                       join=True)

    for name in ("artifacts/TR-007/traces.jsonl", "eval/generations.jsonl"):
        assert (two / name).read_bytes() == (one / name).read_bytes(), name
    assert not list(two.glob("**/*.part*"))
    summary = {d: json.loads((d / "artifacts/TR-007/summary.json").read_text()) for d in (one, two)}
    for s in summary.values():
        s.pop("provenance")
    assert summary[two] == summary[one]
    assert json.loads((two / "eval/generations.summary.json").read_text())["notes"] == 5

    engines = {r: json.loads((two / f"engines{r}.json").read_text()) for r in (0, 1)}
    test_ids = [n["note_id"] for n in NOTES[1:6]]
    for rank, (teacher, student) in engines.items():
        for engine in (teacher, student):   # its own GPU, and no torchrun variable while vLLM starts
            assert engine["environment"] == {"CUDA_VISIBLE_DEVICES": str(rank), "RANK": None, "WORLD_SIZE": None,
                                             "LOCAL_RANK": None, "MASTER_ADDR": None, "MASTER_PORT": None}
        assert len(teacher["seeds"]) == len(NOTES[rank::2])             # note n on engine n mod 2
        assert student["seeds"] == [note_seed(0, n) for n in test_ids[rank::2]]
