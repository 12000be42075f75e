"""`mistill instrument <pass> --traces/--out-dir`: another trace set, same passes, provenance that says so."""

from __future__ import annotations

import argparse

from mistill.instrument import commands


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
