"""`mistill instrument <pass>`: the characterization passes over the notes (App. C).

    events     P1/P2/P2C/NULL events and their margins    -> <out>/<note>/events.jsonl, events_summary.json
    attribute  first-order attribution + exact nominees    -> <out>/<note>/attr.npz
    calibrate  NULL calibration, BH, global sets           -> <out>/head_sets_contrast.json, calibration.json
    knockin    necessity and knock-in per bin              -> <out>/<note>/patch2.jsonl, faithfulness2.json
    selftest   attribution fidelity vs exact patching      -> <out>/selftest.json (Table 8)
    all        the five in order, one model load (the HD-001 stage)
    proxy      every head's c and m at every P1, P2 and P2C event -> <proxy-dir>/<note>/proxy.npz (R-C2, R-D20)
    isolation  each note's own top-k kept alone, and mean-ablated, at its P1 events -> isolation.out_dir (R-C3)
    intact     events, attribution (graph intact, exact P2) and calibration on the first notes -> intact_rerun.out_dir (R-C8)
    readside   the panel's attention over the 15 key categories at every decision -> read_side.out_dir (R-C5)
    keys       the named heads' named keys blocked at the decision token -> read_side.out_dir (R-C10)
    edits      the earlier sibling mention and the note's words edited, re-fed -> read_side.out_dir (R-C11)

Paths and sizes come from the active profile's `instrument` section of params.yaml
(the teacher's id, dtype and device from `models`); `--traces` and `--out-dir` run the
same passes over another trace set, `--teacher teacher_qwq` with another teacher (R-C15).
"""

from __future__ import annotations

import argparse
import dataclasses

from mistill.params import load_params


def _common(parser: argparse.ArgumentParser, *, resumable: bool = True) -> None:
    parser.add_argument("--profile", default=None, help="params.yaml profile (default: the active one)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N notes (smoke runs)")
    # the same passes over another trace set (TR-007 -> HD-002, TR-008 -> TR-008/events)
    parser.add_argument("--traces", default=None, help="trace jsonl (default: params instrument.traces)")
    parser.add_argument("--out-dir", default=None, help="output directory (default: params instrument.out_dir)")
    parser.add_argument("--teacher", default=None,
                        help="another teacher of the profile, a params models key (teacher_qwq: R-C15)")
    if resumable:
        parser.add_argument("--force", action="store_true", help="recompute notes whose artifact is valid")


def _config(args):
    from mistill.instrument.passes import InstrumentConfig
    from mistill.models.loading import set_threads

    params = load_params(profile=args.profile)
    set_threads(params.get("models") or {})   # a bare instrument config (tests) names no models section
    cfg = InstrumentConfig.from_params(params)
    if getattr(args, "teacher", None):
        cfg, params = cfg.with_teacher(params, args.teacher)
    overrides = {k: v for k, v in (("traces", args.traces), ("out_dir", args.out_dir)) if v is not None}
    if not overrides:
        return cfg, params
    # provenance records the paths the passes actually read and wrote
    params = {**params, "instrument": {**params["instrument"], **overrides}}
    return dataclasses.replace(cfg, **overrides), params


def _events(args) -> int:
    from mistill.instrument.passes import run_events

    cfg, params = _config(args)
    summary = run_events(cfg, params, limit=args.limit, force=args.force)
    print(f"events: {summary['counts']} over {summary['notes']} notes ({len(summary['skipped'])} skipped)")
    return 0


def _attribute(args) -> int:
    from mistill.instrument.passes import run_attribution

    cfg, params = _config(args)
    run_attribution(cfg, params, limit=args.limit, force=args.force)
    return 0


def _calibrate(args) -> int:
    from mistill.instrument.passes import run_calibration

    cfg, params = _config(args)
    summary = run_calibration(cfg, params, limit=args.limit)
    print(f"calibrate: split-half NULL discoveries {summary.get('split_half_null_discoveries')}; "
          + ", ".join(f"{p}: +{v.get('bh_positive')}/-{v.get('bh_negative')}" for p, v in summary["phases"].items()))
    return 0


def _knockin(args) -> int:
    from mistill.instrument.passes import run_knockin

    cfg, params = _config(args)
    run_knockin(cfg, params, limit=args.limit, force=args.force)
    return 0


def _selftest(args) -> int:
    from mistill.instrument.passes import run_selftest

    cfg, params = _config(args)
    summary = run_selftest(cfg, params, note_id=args.note)
    print(f"selftest on {summary['note_id']}: pearson intact {summary['intact']['pearson']:.3f}, "
          f"detached {summary['detached']['pearson']:.3f}")
    return 0


def _proxy(args) -> int:
    from pathlib import Path

    from mistill.instrument.proxy import run_proxy

    cfg, params = _config(args)
    out = Path(args.proxy_dir or f"{cfg.out_dir}-proxy")
    summary = run_proxy(cfg, params, out, limit=args.limit, force=args.force)
    print(f"proxy: {summary['notes']} notes ({len(summary['skipped'])} skipped) -> {out}")
    return 0


def _isolation(args) -> int:
    from mistill.instrument.isolation import IsolationSettings, run_isolation

    cfg, params = _config(args)
    if args.isolation_dir:
        params = {**params, "isolation": {**(params.get("isolation") or {}), "out_dir": args.isolation_dir}}
    summary = run_isolation(cfg, params, limit=args.limit, force=args.force)
    print(f"isolation: {summary['n_notes']} notes, {summary['n_events']} P1 events -> "
          f"{IsolationSettings.from_params(params).out_dir}")
    return 0


def _intact(args) -> int:
    from mistill.instrument.intact import run_intact

    cfg, params = _config(args)
    summary = run_intact(cfg, params, force=args.force)
    print(f"intact re-run: calibrated {', '.join(summary['phases'])}")
    return 0


def _readside(args) -> int:
    from mistill.instrument.read_passes import run_readside

    cfg, params = _config(args)
    summary = run_readside(cfg, params, limit=args.limit, force=args.force, read_dir=args.read_dir)
    print(f"read side: a {summary['panel_size']}-head panel and the named heads on {len(summary['notes'])} notes")
    return 0


def _keys(args) -> int:
    from mistill.instrument.read_passes import run_keys

    cfg, params = _config(args)
    summary = run_keys(cfg, params, limit=args.limit, force=args.force)
    print(f"key blocks: {len(summary['reads'])} named reads on {len(summary['notes'])} notes")
    return 0


def _edits(args) -> int:
    from mistill.instrument.read_passes import run_edits

    cfg, params = _config(args)
    summary = run_edits(cfg, params, limit=args.limit, force=args.force)
    print(f"edits: {len(summary['notes'])} notes, mediation heads {', '.join(summary['mediation_heads']) or 'none'}")
    return 0


def _all(args) -> int:
    """Every pass in order: what the HD-001 stage runs (each pass resumes per note)."""
    from mistill.instrument.passes import (
        load_teacher,
        run_attribution,
        run_calibration,
        run_events,
        run_knockin,
        run_selftest,
    )
    from mistill.shard import current as current_shard

    cfg, params = _config(args)
    model, tokenizer = load_teacher(cfg, params)
    kw = dict(model=model, tokenizer=tokenizer)
    run_events(cfg, params, limit=args.limit, force=args.force, **kw)
    run_attribution(cfg, params, limit=args.limit, force=args.force, **kw)
    run_calibration(cfg, params, limit=args.limit)
    run_knockin(cfg, params, limit=args.limit, force=args.force, **kw)
    current_shard().leader_only(lambda: run_selftest(cfg, params, **kw))   # one note: rank 0's work
    return 0


def register(subparsers) -> None:
    for name, func, help_text in (
        ("events", _events, "extract P1/P2/P2C/NULL events and their margins (HD-001/<note>/events.jsonl)"),
        ("attribute", _attribute, "first-order attribution and exact nominee patches (HD-001/<note>/attr.npz)"),
        ("knockin", _knockin, "necessity and knock-in of head sets (patch2.jsonl, faithfulness2.json)"),
        ("all", _all, "every pass in order: events, attribute, calibrate, knockin, selftest (HD-001)"),
        ("readside", _readside, "the teacher's read side: the App. E panel over 15 key categories (read.jsonl)"),
        ("keys", _keys, "the key-side intervention on the named heads (key_intervene.jsonl)"),
        ("edits", _edits, "the trace and note edits at contrastive events (prefix_edit.jsonl, evidence_edit.jsonl)"),
    ):
        parser = subparsers.add_parser(name, help=help_text, description=help_text)
        _common(parser)
        # sharded over params compute.gpus_per_pass processes under torchrun (mistill.shard)
        parser.set_defaults(func=func, sharded=True)
        if name == "readside":
            parser.add_argument("--read-dir", default=None, help="where the reads go (default: "
                                "read_side.out_dir/readside; HD-002-read for the shortlist run)")
    parser = subparsers.add_parser("calibrate", help="NULL calibration, BH tests, global sets "
                                   "(head_sets_contrast.json)")
    _common(parser, resumable=False)
    parser.set_defaults(func=_calibrate)
    parser = subparsers.add_parser("selftest", help="attribution fidelity against exact patching (selftest.json)")
    _common(parser, resumable=False)
    parser.add_argument("--note", default=None, help="note id (default: the first with enough P1 events)")
    parser.set_defaults(func=_selftest)
    parser = subparsers.add_parser("intact", help="the attribution pass again with the graph intact and exact P2 "
                                   "patches on the first notes (params intact_rerun; R-C8)")
    _common(parser)
    parser.set_defaults(func=_intact)
    parser = subparsers.add_parser("proxy", help="every head's contribution proxy c and region mass m at every P1, P2 "
                                   "and P2C event (<proxy-dir>/<note>/proxy.npz)")
    _common(parser)
    parser.add_argument("--proxy-dir", default=None, help="output directory (default: <out-dir>-proxy)")
    parser.set_defaults(func=_proxy)
    parser = subparsers.add_parser("isolation", help="each note's own top-k heads kept alone, and mean-ablated, at "
                                   "its P1 events (App. D; <isolation-dir>/<note>/isolation.npz)")
    _common(parser)
    parser.add_argument("--isolation-dir", default=None, help="output directory (default: params isolation.out_dir)")
    parser.set_defaults(func=_isolation)
