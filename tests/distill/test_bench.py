"""The training benchmark runs end to end (tiny shape on CPU; the Qwen3-4B shape on a GPU)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_training.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_training", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_bench_tiny_cpu(capsys):
    assert _bench().main(["--device", "cpu", "--shape", "tiny", "--prompt-tokens", "600", "--trace-tokens", "200",
                          "--notes", "1", "--mlp-chunk", "128"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["arms"]) == {"vanilla", "mistill"} and out["events"]["P1"] > 0
    assert out["arms"]["mistill"]["log"]["P1_attn"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bench_qwen3_4b_goals(capsys):
    assert _bench().main(["--device", "cuda", "--shape", "qwen3-4b", "--prompt-tokens", "30000",
                          "--trace-tokens", "6000", "--notes", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(out["goals"].values()), out["goals"]
