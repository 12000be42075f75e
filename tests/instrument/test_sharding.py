"""Per-note passes sharded over processes (mistill.shard): two gloo processes on a CPU write the same
artifacts as one process computing both lanes, bit for bit; a rank that dies leaves only valid files
and the rerun computes only the missing notes; the torchrun environment and the relaunch."""

from __future__ import annotations

import json
import os
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from mistill import shard as shard_module
from mistill.errors import UserError
from mistill.instrument import passes
from mistill.shard import Shard, gpus_per_pass, relaunch
from tests.instrument.conftest import QwenTextTokenizer, _write_world, tiny_qwen3

NOTES = ("note0", "note1", "note2")
BAD = [{"note_id": "bad_empty", "prompt": "p", "completion": "<think>\nnothing to code here.\n</think>\n\n[]"}]


def test_the_torchrun_environment_names_the_shard():
    assert Shard.from_env({}) == Shard(0, 1, 0)
    s = Shard.from_env({"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1"})
    assert (s.rank, s.world, s.local_rank, s.leader) == (1, 3, 1, False)
    assert s.mine(list("abcdefg")) == ["b", "e"] and [n for n in range(7) if s.owns(n)] == [1, 4]
    with pytest.raises(UserError, match="RANK=3 is not a rank of WORLD_SIZE=3"):
        Shard.from_env({"RANK": "3", "WORLD_SIZE": "3"})
    with pytest.raises(UserError, match="must be integers"):
        Shard.from_env({"RANK": "one", "WORLD_SIZE": "2"})


def test_relaunch_runs_the_command_again_under_torchrun(monkeypatch):
    ran = []
    monkeypatch.setattr(os, "execv", lambda exe, argv: ran.append(argv))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    relaunch(["instrument", "all"], 1)
    assert ran == []                                       # one process: nothing to start
    relaunch(["instrument", "all"], 2)
    assert ran[0][1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                          "mistill.cli", "instrument", "all"]
    monkeypatch.setenv("LOCAL_RANK", "0")                  # already a torchrun worker
    relaunch(["instrument", "all"], 2)
    assert len(ran) == 1
    with pytest.raises(UserError, match="gpus_per_pass: 0"):
        relaunch(["instrument", "all"], 0)
    assert gpus_per_pass({}) == 1 and gpus_per_pass({"compute": {"gpus_per_pass": 4}}) == 4


# ---- two processes against one ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _passes(cfg, params, model, tokenizer, **attribution):
    passes.run_events(cfg, params, model=model, tokenizer=tokenizer)
    passes.run_attribution(cfg, params, model=model, tokenizer=tokenizer, **attribution)
    passes.run_calibration(cfg, params)
    passes.run_knockin(cfg, params, model=model, tokenizer=tokenizer)


def _worker(rank: int, world: int, port: int, out_dir: str, die_after: int | None, device: str = "cpu"):
    """One torchrun-like rank: the passes on its notes; with `die_after`, rank 0 dies once it has
    committed that many attribution artifacts."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    tokenizer = QwenTextTokenizer()
    model = tiny_qwen3(tokenizer.vocab_size, layers=2, heads=4, kv_heads=2, seed=1)
    if device != "cpu":
        shard_module.current()                  # joins the group and picks this rank's GPU first
        model = model.to(device)
    cfg = _write_world_at(out_dir)
    params = {"profile": "test", "instrument": cfg.as_dict()}
    if die_after is not None:
        commit = passes.commit_artifact
        committed = []

        def commit_then_die(path, write, meta):
            commit(path, write, meta)
            committed.append(path)
            if rank == 0 and path.name == "attr.npz" and len(committed) >= die_after:
                os._exit(3)                               # killed mid-pass, after a committed file

        passes.commit_artifact = commit_then_die
    _passes(cfg, params, model, tokenizer)


def _write_world_at(root: str):
    from pathlib import Path

    return _write_world(Path(root), BAD)


def _spawn(world: int, out_dir, die_after: int | None = None, device: str = "cpu") -> None:
    mp.start_processes(_worker, args=(world, _free_port(), str(out_dir), die_after, device), nprocs=world,
                       start_method="spawn", join=True)


def _artifacts(out) -> dict:
    """Every per-note artifact and summary, without provenance (it names the process)."""
    body = {}
    for note in NOTES:
        body[f"{note}/events"] = (out / note / "events.jsonl").read_text()
        body[f"{note}/patch2"] = (out / note / "patch2.jsonl").read_text()
        with np.load(out / note / "attr.npz") as attr:
            body.update({f"{note}/attr/{k}": attr[k] for k in attr.files})
    for name in ("head_sets_contrast.json", "faithfulness2.json", "events_summary.json", "skipped_attribute.json"):
        data = json.loads((out / name).read_text())
        data.pop("provenance", None)
        body[name] = data
    return body


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_two_processes_write_what_one_process_writes_for_two_lanes(tmp_path, qwen_model, tokenizer, one_thread):
    _spawn(2, tmp_path / "two")
    cfg = _write_world(tmp_path / "one", BAD)
    _passes(cfg, {"profile": "test", "instrument": cfg.as_dict()}, qwen_model, tokenizer, lanes=2)
    two, one = _artifacts(tmp_path / "two" / "HD-001"), _artifacts(tmp_path / "one" / "HD-001")
    assert two.keys() == one.keys()
    for key in one:
        if isinstance(one[key], np.ndarray):
            np.testing.assert_array_equal(two[key], one[key], err_msg=key)
        else:
            assert two[key] == one[key], key
    # each note was computed by its rank: note n on rank n mod 2, its lane
    metas = {n: json.loads((tmp_path / "two" / "HD-001" / n / "attr.npz.meta.json").read_text()) for n in NOTES}
    assert [metas[n]["lane"] for n in NOTES] == [0, 1, 0] and metas["note2"]["note_index"] == 2
    assert one["events_summary.json"]["skipped"] == {"bad_empty": two["events_summary.json"]["skipped"]["bad_empty"]}


def test_a_rank_that_dies_leaves_valid_files_and_the_rerun_computes_only_the_missing(
        tmp_path, qwen_model, tokenizer, one_thread, capsys):
    with pytest.raises(mp.ProcessExitedException):
        _spawn(2, tmp_path, die_after=1)
    out = tmp_path / "HD-001"
    states = {n: passes.artifact_state(out / n / "attr.npz", passes.load_attr) for n in NOTES}
    # rank 0 dies after a commit; the launcher then stops rank 1 wherever it is, possibly between an artifact and
    # its meta, which the state names unfinished (never a partial file: writes are atomic)
    assert states["note0"] == "valid"
    assert all(s in ("valid", "missing") or s.startswith("unfinished") for s in states.values()), states
    # a rank stopped mid-write leaves at most a hidden temporary sibling, never a partial file in the
    # artifact's place; the rerun removes it
    assert all(t.name.startswith(".") for t in out.glob("**/*.tmp")), list(out.glob("**/*.tmp"))
    missing = sum(s != "valid" for s in states.values())
    assert missing >= 1                                   # rank 0 died before note2
    cfg = _write_world(tmp_path, BAD)
    capsys.readouterr()
    passes.run_attribution(cfg, {"profile": "test", "instrument": cfg.as_dict()}, model=qwen_model,
                           tokenizer=tokenizer, lanes=2)
    assert f"{missing} computed, {3 - missing} already done" in capsys.readouterr().err
    assert not list(out.glob("**/*.tmp"))


def test_lanes_must_match_the_processes(tmp_path, qwen_model, tokenizer, monkeypatch):
    cfg = _write_world(tmp_path, BAD)
    params = {"profile": "test", "instrument": cfg.as_dict()}
    passes.run_events(cfg, params, model=qwen_model, tokenizer=tokenizer)
    monkeypatch.setattr(shard_module, "_current", Shard(0, 2, 0))
    with pytest.raises(UserError, match="each of the 2 processes is one lane"):
        passes.run_attribution(cfg, params, model=qwen_model, tokenizer=tokenizer, lanes=3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_two_processes_on_the_gpu_agree_with_one_process_computing_both_lanes(tmp_path, tokenizer):
    """On a host's GPUs (with one GPU both ranks share it): the same artifacts up to GPU kernel noise."""
    _spawn(2, tmp_path / "two", device="cuda")
    model = tiny_qwen3(tokenizer.vocab_size, layers=2, heads=4, kv_heads=2, seed=1).cuda()
    cfg = _write_world(tmp_path / "one", BAD)
    _passes(cfg, {"profile": "test", "instrument": cfg.as_dict()}, model, tokenizer, lanes=2)
    two, one = _artifacts(tmp_path / "two" / "HD-001"), _artifacts(tmp_path / "one" / "HD-001")
    assert two.keys() == one.keys()
    for key in one:
        if isinstance(one[key], np.ndarray) and one[key].dtype.kind == "f":
            np.testing.assert_allclose(two[key], one[key], rtol=1e-4, atol=1e-4, equal_nan=True, err_msg=key)
        elif isinstance(one[key], np.ndarray):
            np.testing.assert_array_equal(two[key], one[key], err_msg=key)
    ranking = {p: [(r["layer"], r["head"]) for r in rows][:4]
               for p, rows in one["head_sets_contrast.json"]["phases"].items()}
    assert ranking == {p: [(r["layer"], r["head"]) for r in rows][:4]
                       for p, rows in two["head_sets_contrast.json"]["phases"].items()}
