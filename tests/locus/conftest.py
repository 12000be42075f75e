"""A tiny world of the App. B prompt (a random Qwen3 over hand-made traces) for the locus passes."""

from __future__ import annotations

import pytest

from mistill.instrument.passes import run_attribution, run_calibration, run_events
from mistill.io import read_jsonl, write_jsonl
from mistill.world.inventory import format_line
from mistill.world.prompt import build_prompt
from mistill.world.types import Code
from tests.instrument.conftest import INVENTORY, _write_world, qwen_model, tokenizer  # noqa: F401

NOTE = "the patient has chronic kidney disease stage 3 and type 2 diabetes with essential hypertension"


@pytest.fixture(scope="module")
def prompt_world(tmp_path_factory, qwen_model, tokenizer):  # noqa: F811
    """The instrument's hand-made traces under the real prompt layout, with HD-001's events and sets."""
    tmp_path = tmp_path_factory.mktemp("prompt_world")
    cfg = _write_world(tmp_path)
    lines = [format_line(Code(c, d)) for c, d in INVENTORY]
    traces = [{**t, "prompt": build_prompt(NOTE, lines)} for t in read_jsonl(tmp_path / "traces.jsonl")]
    write_jsonl(tmp_path / "traces.jsonl", traces)
    params = {"profile": "test", "instrument": cfg.as_dict()}
    run_events(cfg, params, model=qwen_model, tokenizer=tokenizer)
    run_attribution(cfg, params, model=qwen_model, tokenizer=tokenizer)
    run_calibration(cfg, params)
    return tmp_path, cfg, params
