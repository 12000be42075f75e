"""`mistill evaluate own-heads | own-traces | compare` (App. K M4/M2/M3, App. L; R-D6, R-D29).

Hooked into `mistill evaluate` by `mistill.evaluate.commands.register`:

    from mistill.evaluate import own_heads_commands
    own_heads_commands.register(subparsers)
"""

from __future__ import annotations

from pathlib import Path

from mistill.errors import UserError


def _params():
    from mistill.params import load_params

    return load_params()


def variant_stages(stages: list[str], variant: str, params: dict) -> list[str]:
    """A recipe variant's chain traces the edits only when a result reads them: the variants params
    `variants.edited` names (R-D28 and R-D30 read their edits); no other variant's edits are read, and they are
    the chain's costliest part."""
    variants = params.get("variants") or {}
    if variant not in (variants.get("arms") or {}):
        raise UserError(f"--variant {variant}: not an entry of params variants.arms")
    if variant in (variants.get("edited") or {}):
        return stages
    return [s for s in stages if s != "edits"]


def cmd_own_heads(args) -> int:
    from mistill.evaluate.own_heads import STAGES, run_chain
    from mistill.models.loading import set_threads

    params = _params()
    set_threads(params["models"], args.threads)
    if args.attn_implementation:   # the chain's model loads with it; provenance records it
        instrument = params.get("instrument") or {}
        params = {**params, "instrument": {**instrument, "attribution": {
            **(instrument.get("attribution") or {}), "attn_implementation": args.attn_implementation}}}
    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else list(STAGES)
    if args.variant is not None:
        stages = variant_stages(stages, args.variant, params)
    timing = run_chain(args.model, args.arm, int(args.seed), params, stages=stages, student_key=args.student,
                       limit=args.limit, force=args.force, out_root=args.out_root, heads_from=args.heads_from)
    print("own-heads " + f"{args.arm}-s{args.seed}: " + " ".join(f"{k}={v:.1f}s" for k, v in timing.items()))
    return 0


def cmd_probe_heads(args) -> int:
    """The probe ranking moves the head into the smallest own-heads bin (params evaluate.own_heads.bins: the
    paper's k = 8)."""
    from mistill.evaluate.probe import reference_dirs, write_probe

    params = _params()
    references = reference_dirs(Path(args.reference_root), args.reference_label)
    if not references:
        raise UserError(f"{args.reference_root}: no {args.reference_label}-s<seed> directory to take the probe "
                        "head from")
    rank = min(int(k) for k in params["evaluate"]["own_heads"]["bins"])
    record = write_probe(Path(args.heads), references, rank, Path(args.out))
    print(f"probe: {record['head']} (rank {record['rank_in_arm']} in {args.heads}; ranks {record['reference_ranks']} "
          f"in {args.reference_label}) moved to rank {rank} -> {args.out}")
    return 0


def cmd_own_traces(args) -> int:
    from mistill.evaluate.own_heads import arm_dirs
    from mistill.evaluate.own_traces import own_trace_root, run_own_traces
    from mistill.models.loading import set_threads

    params = _params()
    set_threads(params["models"], args.threads)
    artifacts = (params.get("paths") or {}).get("artifacts", "artifacts")
    heads_from = args.heads_from or arm_dirs(artifacts, args.arm, int(args.seed))[0]
    root = args.out_root or str(own_trace_root(artifacts))
    coverage = run_own_traces(args.model, args.arm, int(args.seed), params, generations=args.generations,
                              heads_from=heads_from, root=root, student_key=args.student, limit=args.limit,
                              force=args.force)
    print(f"own traces {args.arm}-s{args.seed}: {coverage['completed']} of {coverage['generated']} generations "
          f"completed, {coverage['with_events']} with events -> {root}")
    return 0


def cmd_compare(args) -> int:
    from mistill.evaluate.compare import PHASES, compare_arms
    from mistill.evaluate.own_heads import OwnHeadsConfig
    from mistill.io import provenance, write_json
    from mistill.stats import StatsParams

    params = _params()
    cfg = OwnHeadsConfig.from_params(params)
    stats = StatsParams.from_params(params)
    k = int(args.k) if args.k is not None else max(cfg.bins)
    if k not in cfg.bins:
        raise UserError(f"--k {k}: the chain knocked in k in {list(cfg.bins)} (params evaluate.own_heads.bins)")
    result = compare_arms(cfg.artifacts, args.arm, args.reference, k=k, stats=stats, min_range=cfg.min_range)
    out = Path(args.out) if args.out else Path(cfg.artifacts) / "M6-compare" / f"{args.arm}__vs__{args.reference}.json"
    write_json(out, {**result, "provenance": provenance({"evaluate": params.get("evaluate"),
                                                         "stats": params.get("stats")})})
    for phase in PHASES:
        c = result["m4"][phase]["comparison"]
        if c:
            print(f"M4 {phase} k={k}: {c['mean_difference']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}] "
                  f"higher {c['notes_higher']}/{c['n_notes']} sign p={c['sign_p']:.3g} wilcoxon p={c['wilcoxon_p']:.3g}")
    print(f"-> {out}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("own-heads", help="one arm's own heads: attribution, knock-in (M4), read side (M2, M3)")
    p.add_argument("--model", required=True, help="the arm's checkpoint (e.g. artifacts/DT-001/<run>/model)")
    p.add_argument("--arm", required=True, help="arm label naming HD-S/<arm>-s<seed>/ and M6/<arm>-s<seed>/")
    p.add_argument("--seed", type=int, default=0, help="the arm's training seed (names the outputs)")
    p.add_argument("--student", help="params models key (student_qwen, student_smol) for its rope scaling")
    p.add_argument("--stages", help="comma list of attribute,knockin,readside,edits (default: all, in order)")
    p.add_argument("--limit", type=int, help="only the first N notes of each trace set (smoke runs)")
    p.add_argument("--force", action="store_true", help="recompute per-note artifacts that are already valid")
    p.add_argument("--threads", type=int, help="intra-op threads (default: params models.threads)")
    p.add_argument("--attn-implementation", choices=("eager", "sdpa"),
                   help="attention kernels (default: params instrument.attribution.attn_implementation)")
    p.add_argument("--out-root", help="write HD-S/ and M6/ under this directory (default: params paths.artifacts)")
    p.add_argument("--heads-from", help="an HD-S/<arm>-s<seed> directory whose ranking the knock-in and read side "
                                        "use (no attribution pre-pass)")
    p.add_argument("--variant", help="the run is this recipe variant (a params variants.arms key): its trace edits "
                                     "run only if params variants.edited names it")
    p.set_defaults(func=cmd_own_heads, sharded=True)   # params compute.gpus_per_pass processes (mistill.shard)

    p = subparsers.add_parser("probe-heads", help="the post-hoc rank probe (App. I.4, L.3): an arm's own ranking "
                                                  "with the references' consensus head moved into its top-k")
    p.add_argument("--heads", required=True, help="the arm's HD-S/<arm>-s<seed> directory")
    p.add_argument("--reference-root", required=True, help="the HD-S directory holding the reference arm's seeds")
    p.add_argument("--reference-label", required=True, help="the reference arm's label (<label>-s<seed>, every seed)")
    p.add_argument("--out", required=True, help="the probe's HD-S directory (head_sets_contrast.json, probe.json)")
    p.set_defaults(func=cmd_probe_heads)

    p = subparsers.add_parser("own-traces", help="one arm's own-heads knock-in on its own completed test "
                                                 "generations (App. L.4)")
    p.add_argument("--model", required=True, help="the arm's checkpoint (e.g. artifacts/DT-001/<run>/model)")
    p.add_argument("--arm", required=True, help="arm label, as its own-heads chain names it")
    p.add_argument("--seed", type=int, default=0, help="the arm's training seed")
    p.add_argument("--student", help="params models key (student_qwen, student_smol) for its rope scaling")
    p.add_argument("--generations", required=True, help="the arm's test generations (DT-eval/<run>/generations.jsonl)")
    p.add_argument("--heads-from", help="the arm's HD-S directory (default: <artifacts>/HD-S/<arm>-s<seed>)")
    p.add_argument("--out-root", help="runs/ and M6/ go under it (default: <artifacts>/own-trace)")
    p.add_argument("--limit", type=int, help="only the first N completed generations (smoke runs)")
    p.add_argument("--force", action="store_true", help="recompute per-note artifacts that are already valid")
    p.add_argument("--threads", type=int, help="intra-op threads (default: params models.threads)")
    p.set_defaults(func=cmd_own_traces)

    p = subparsers.add_parser("compare", help="two arms' own-heads readouts, seed-matched and note-clustered")
    p.add_argument("--arm", required=True, help="arm label, e.g. student-qwen-mistill-bf16")
    p.add_argument("--reference", required=True, help="reference arm label, e.g. student-qwen-vanilla-fp32")
    p.add_argument("--k", type=int, help="knock-in set size (default: the largest of evaluate.own_heads.bins)")
    p.add_argument("--out", help="default: <artifacts>/M6-compare/<arm>__vs__<reference>.json")
    p.set_defaults(func=cmd_compare)
