"""`mistill locus <pass>`: the prose-locus passes over the characterization notes (App. F).

    probe      walk-back of every chapter mention, window attribution   -> <out>/<note>/locus.json, window.npz
    calibrate  prose-time and suffix sets (mentions minus NULL)         -> <out>/head_sets_locus.json
    ablate     window / suffix ablations and the read at the locus      -> <out>/<note>/ablation.json
    all        the three in order, one model load (the HD-001-locus stage)
    follow     the follow-through of window-decided mentions            -> <follow_out_dir>/<note>/follow.json
    swap       the residual swap between window-decided mentions         -> <swap.out_dir>/<note>/swap.json

Settings come from params `locus` (out_dir, suffix, theta, window, set sizes); the traces, events,
means and emission sets from the `instrument` section's run (HD-001).  `--traces`, `--instrument-dir`
and `--out-dir` run the same passes on another run (TR-007 and HD-002 -> locus.shortlist_out_dir),
`--teacher teacher_qwq` with another teacher (R-C15: TR-QWQ and HD-QWQ);
`probe --suffix-variant D` walks back under another forcing wording (params locus.suffix_rerun, R-C13);
`probe --model <checkpoint> --student student_qwen` probes a student (M5, R-D15; params student_locus).
"""

from __future__ import annotations

import argparse
import dataclasses

from mistill.params import load_params


def _settings(args):
    from mistill.instrument.passes import InstrumentConfig
    from mistill.locus.passes import LocusSettings
    from mistill.models.loading import set_threads

    params = load_params(profile=args.profile)
    set_threads(params.get("models") or {})
    cfg, settings = InstrumentConfig.from_params(params), LocusSettings.from_params(params)
    if args.teacher:
        cfg, params = cfg.with_teacher(params, args.teacher)
    instrument = {k: v for k, v in (("traces", args.traces), ("out_dir", args.instrument_dir)) if v is not None}
    if instrument:
        cfg = dataclasses.replace(cfg, **instrument)
        params = {**params, "instrument": {**params["instrument"], **instrument}}
    if args.out_dir is not None:
        settings = dataclasses.replace(settings, out_dir=args.out_dir)
        params = {**params, "locus": {**params["locus"], "out_dir": args.out_dir}}
    if getattr(args, "suffix_variant", None):
        settings = settings.suffix_variant(params, args.suffix_variant)
        params = {**params, "locus": {**params["locus"], "suffix": settings.suffix,
                                      "letter_prefix": settings.letter_prefix}}
    return cfg, settings, params


def _resumable(runner: str, module: str = "passes"):
    """A resumable pass of `mistill.locus.<module>` (passes: run_probe, run_ablate, run_all, run_follow, run_swap;
    read: run_locus_read) as a command."""
    def command(args) -> int:
        import importlib

        passes = importlib.import_module(f"mistill.locus.{module}")
        cfg, settings, params = _settings(args)
        if getattr(args, "model", None):
            cfg, model, tokenizer = _student(args, cfg, params)
            getattr(passes, runner)(cfg, settings, params, model=model, tokenizer=tokenizer, limit=args.limit,
                                    force=args.force)
            return 0
        getattr(passes, runner)(cfg, settings, params, limit=args.limit, force=args.force)
        return 0
    return command


def _student(args, cfg, params):
    """A student checkpoint in the teacher's place (M5, App. K): its weights name the run's config, and the
    events it reads are the teacher's realised in its tokenizer (the own-heads chain's HD-S directory)."""
    from mistill.evaluate.own_heads import load_student, weights_fingerprint

    model, tokenizer = load_student(args.model, params, args.student)
    return dataclasses.replace(cfg, teacher=f"student weights {weights_fingerprint(model)}"), model, tokenizer


def _calibrate(args) -> int:
    from mistill.locus.passes import run_calibrate

    cfg, settings, params = _settings(args)
    body = run_calibrate(cfg, settings, params, limit=args.limit)
    top = body["phases"]["prose"][:3]
    print("locus calibrate: prose-time top " + ", ".join(f"l{h['layer']}h{h['head']}" for h in top))
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    for name, func, summary, resumable in (
            ("probe", _resumable("run_probe"), "walk back from every chapter letter; attribute the windows", True),
            ("calibrate", _calibrate, "the prose-time and suffix sets (mentions minus NULL)", False),
            ("ablate", _resumable("run_ablate"), "window and suffix ablations; the read at the locus", True),
            ("all", _resumable("run_all"), "probe, calibrate and ablate, one model load", True),
            ("follow", _resumable("run_follow"), "the follow-through of window-decided mentions to the letter", True),
            ("swap", _resumable("run_swap"), "swap the residual stream between window-decided mentions", True),
            ("read", _resumable("run_locus_read", "read"), "what four head groups read at each locus (Table 33)", True)):
        p = commands.add_parser(name, help=summary, description=summary)
        p.add_argument("--profile", default=None, help="params.yaml profile (default: the active one)")
        p.add_argument("--limit", type=int, default=None, help="only the first N notes (smoke runs)")
        p.add_argument("--traces", default=None, help="trace jsonl (default: params instrument.traces)")
        p.add_argument("--instrument-dir", default=None,
                       help="the run whose events, means and emission sets to read (default: params instrument.out_dir)")
        p.add_argument("--out-dir", default=None, help="output directory (default: params locus.out_dir)")
        p.add_argument("--teacher", default=None,
                       help="another teacher of the profile, a params models key (teacher_qwq: R-C15)")
        if resumable:
            p.add_argument("--force", action="store_true", help="recompute notes whose artifact is valid")
        if name == "probe":
            p.add_argument("--suffix-variant", default=None,
                           help="another forcing wording, params locus.suffix_rerun.variants (R-C13's re-runs)")
            p.add_argument("--model", default=None,
                           help="a student checkpoint or id to probe instead of the teacher (M5; --instrument-dir: "
                                "its own-heads HD-S directory, whose events are realised in its tokenizer)")
            p.add_argument("--student", default=None,
                           help="the student's params models key (student_qwen, student_smol): its loading settings")
        p.set_defaults(func=func)
