"""`mistill instrument <pass> --traces/--out-dir`: another trace set, same passes, provenance that says so."""

from __future__ import annotations

import argparse

import pytest

from mistill.errors import UserError
from mistill.instrument import commands
from mistill.locus import commands as locus_commands
from mistill.params import load_params


def parse(argv):
    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_overrides_replace_paths_and_provenance():
    args = parse(["events", "--traces", "artifacts/TR-008/traces.jsonl", "--out-dir", "artifacts/TR-008/events"])
    cfg, params = commands._config(args)
    assert (cfg.traces, cfg.out_dir) == ("artifacts/TR-008/traces.jsonl", "artifacts/TR-008/events")
    assert params["instrument"]["traces"] == "artifacts/TR-008/traces.jsonl"
    assert params["instrument"]["out_dir"] == "artifacts/TR-008/events"


def test_defaults_come_from_params():
    cfg, params = commands._config(parse(["calibrate"]))
    assert cfg.traces == params["instrument"]["traces"] and cfg.out_dir == params["instrument"]["out_dir"]
    cfg2, _ = commands._config(parse(["calibrate", "--out-dir", "elsewhere"]))
    assert cfg2.out_dir == "elsewhere" and cfg2.traces == cfg.traces and cfg2.pool_k == cfg.pool_k


def test_another_teacher_takes_its_own_model_and_positions():
    """`--teacher teacher_qwq` (R-C15): the second teacher's checkpoint and YaRN setting, recorded in the
    provenance; the first teacher's run is untouched by default; an unknown key is a one-line error."""
    cfg, params = commands._config(parse(["all", "--teacher", "teacher_qwq", "--out-dir", "artifacts/HD-QWQ"]))
    models = params["models"]
    assert cfg.teacher == models["teacher_qwq"] == params["instrument"]["teacher"]
    assert cfg.rope_scaling == models["rope_scaling"]["teacher_qwq"] and cfg.out_dir == "artifacts/HD-QWQ"
    first, _ = commands._config(parse(["all"]))
    assert first.teacher == models["teacher"]
    # the paper profile: QwQ-32B under its own YaRN base, not Qwen3-14B's
    paper = load_params(profile="paper")
    qwq, recorded = first.with_teacher(paper, "teacher_qwq")
    assert qwq.teacher == "Qwen/QwQ-32B" and recorded["instrument"]["teacher"] == "Qwen/QwQ-32B"
    assert qwq.rope_scaling["original_max_position_embeddings"] == 32768
    with pytest.raises(UserError, match="models.teacher_llama: no such model"):
        first.with_teacher(paper, "teacher_llama")
    # the prose-locus passes take the same switch
    parser = argparse.ArgumentParser()
    locus_commands.register(parser.add_subparsers(dest="command"))
    locus_cfg, _, _ = locus_commands._settings(parser.parse_args(["all", "--teacher", "teacher_qwq"]))
    assert locus_cfg.teacher == models["teacher_qwq"]
