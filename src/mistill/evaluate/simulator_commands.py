"""`mistill simulator train | predict`: the learned answer simulator of LAS (App. K, "Fidelity").

`train` fine-tunes the simulator once on the teacher's training traces (params `distill.traces`,
`evaluate.train_notes`; valid traces only); `predict` answers every row of one arm's generations
from the note with the arm's rationale, from the note alone and from the rationale alone, and writes
the {note_id, with_rationale, note_only, rationale_only} rows that `mistill evaluate fidelity
--simulator` turns into App. K's LAS (the simulatability gain) and Hase et al.'s leakage-adjusted LAS.
Settings come from the params section `simulator` (`mistill.evaluate.simulator` has the method).

Hooked into the CLI as the `simulator` group by `mistill.simulator.commands`.
"""

from __future__ import annotations

from pathlib import Path

from mistill.errors import UserError

TRAIN_KEYS = ("epochs", "batch", "lr", "warmup_frac", "clip", "precision", "seed")


def _params() -> tuple[dict, dict]:
    from mistill.params import load_params

    params = load_params()
    cfg = params.get("simulator")
    if not isinstance(cfg, dict):
        raise UserError("params.yaml: the active profile has no `simulator` section (model, epochs, batch, lr, "
                        "warmup_frac, clip, precision, seed, max_new_tokens, predict_batch)")
    missing = [k for k in ("model", *TRAIN_KEYS) if k not in cfg]
    if missing:
        raise UserError(f"params simulator: missing {', '.join(missing)}")
    return params, cfg


def train_config(cfg: dict):
    """The shared trainer's settings from params `simulator`."""
    from mistill.distill.trainer import TrainConfig

    return TrainConfig(epochs=int(cfg["epochs"]), batch=int(cfg["batch"]), lr=float(cfg["lr"]),
                       warmup_frac=float(cfg["warmup_frac"]), clip=float(cfg["clip"]),
                       precision=str(cfg["precision"]), seed=int(cfg["seed"]),
                       gradient_checkpointing=bool(cfg.get("gradient_checkpointing", False)),
                       save_every=int(cfg.get("save_every", 1)))


def base_spec(models: dict, cfg: dict, **overrides):
    """The simulator's base model: a params models key, or an HF id / directory (its revision from
    `simulator.revision` when set)."""
    from mistill.models.loading import ModelSpec

    if cfg.get("revision"):
        overrides["revision"] = str(cfg["revision"])
    return ModelSpec.from_params(models, str(cfg["model"]), **overrides)


def cmd_train(args) -> int:
    import torch

    from mistill.distill.trainer import precision_dtype
    from mistill.evaluate import simulator as sim
    from mistill.io import provenance, read_jsonl
    from mistill.models.fingerprint import model_fingerprint
    from mistill.models.loading import load_model, resolve_device, set_threads
    from mistill.world.notes import load_notes

    params, cfg = _params()
    set_threads(params["models"], args.threads)
    traces_path = Path(args.traces or params["distill"]["traces"])
    notes_path = Path(args.notes or params["evaluate"]["train_notes"])
    if not traces_path.exists():
        raise UserError(f"{traces_path}: no teacher traces (run `dvc repro TR-008` first)")
    train_ids = {n.note_id for n in load_notes(notes_path)}
    config = train_config(cfg)
    spec = base_spec(params["models"], cfg, dtype=precision_dtype(config.precision), attn_implementation="sdpa")
    torch.manual_seed(config.seed)
    model, tokenizer = load_model(spec, device=resolve_device(params["models"].get("device")))
    examples = sim.build_examples(read_jsonl(traces_path, "teacher traces"), tokenizer, train_ids)
    run_config = {"base": str(cfg["model"]), "base_source": spec.source, "base_revision": spec.revision,
                  "base_sha256": model_fingerprint(spec), "traces": str(traces_path), "train_notes": str(notes_path),
                  "n_notes": len({ex.source for ex in examples}),
                  "provenance": provenance({"simulator": cfg}, seed=config.seed)}
    out = Path(args.out)
    rows = sim.train_simulator(model, tokenizer, examples, config, out, run_config=run_config,
                               max_steps=args.max_steps)
    if rows:
        print(f"simulator: {len(examples)} examples, {len(rows)} optimiser steps, "
              f"loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f} -> {out}")
    else:
        print(f"simulator: already trained -> {out}")
    return 0


def cmd_predict(args) -> int:
    from mistill.evaluate import simulator as sim
    from mistill.io import provenance, read_jsonl, write_json, write_jsonl
    from mistill.models.loading import ModelSpec, load_model, resolve_device, set_threads
    from mistill.models.world_files import data_dir
    from mistill.world.inventory import load_inventory
    from mistill.world.notes import load_notes

    params, cfg = _params()
    set_threads(params["models"], args.threads)
    model_dir = Path(args.simulator) / "model"
    if not model_dir.is_dir():
        raise UserError(f"{args.simulator}: no trained simulator (model/); run `mistill simulator train` first")
    # the checkpoint as saved (its dtype); sdpa: nothing here reads attention weights
    model, tokenizer = load_model(ModelSpec(source=str(model_dir), attn_implementation="sdpa"),
                                  device=resolve_device(params["models"].get("device")))
    gens = Path(args.generations)
    if not gens.exists():
        raise UserError(f"{gens}: no generations")
    rows = read_jsonl(gens, "generations")
    if args.notes:
        keep = {n.note_id for n in load_notes(args.notes)}
        rows = [r for r in rows if r["note_id"] in keep]
    if not rows:
        raise UserError(f"{gens}: no rows to answer{' for ' + args.notes if args.notes else ''}")
    inventory = load_inventory(Path(args.inventory) if args.inventory else data_dir(params) / "inventory.jsonl")
    max_new = int(args.max_new_tokens or cfg.get("max_new_tokens", 64))
    batch = int(args.batch or cfg.get("predict_batch", 16))
    preds = sim.predict(model, tokenizer, rows, inventory, max_new_tokens=max_new, batch_size=batch,
                        keep_text=True, progress=True)
    out = Path(args.out)
    write_jsonl(out, preds)
    write_json(out.with_name(out.stem + ".summary.json"), {
        "notes": len(preds), "generations": str(gens), "simulator": str(args.simulator),
        "decoding": {"greedy": True, "max_new_tokens": max_new},
        "empty_with_rationale": sum(not p["with_rationale"] for p in preds),
        "empty_note_only": sum(not p["note_only"] for p in preds),
        "empty_rationale_only": sum(not p["rationale_only"] for p in preds),
        "provenance": provenance({"simulator": cfg})})
    print(f"simulator: {len(preds)} notes answered -> {out}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="fine-tune the simulator once on the teacher's training traces")
    p.add_argument("--out", required=True, help="run directory: model/, config.json, metrics.jsonl, checkpoint.pt")
    p.add_argument("--traces", help="teacher traces (default: params distill.traces)")
    p.add_argument("--notes", help="training notes (default: params evaluate.train_notes)")
    p.add_argument("--max-steps", type=int, help="stop after this many optimiser steps (resumable)")
    p.add_argument("--threads", type=int, help="intra-op threads (default: params models.threads)")
    p.set_defaults(func=cmd_train)

    p = subparsers.add_parser("predict", help="the simulator's answers with and without an arm's rationale, and "
                                              "from the rationale alone")
    p.add_argument("--simulator", required=True, help="a `mistill simulator train` run directory")
    p.add_argument("--generations", required=True, help="trace-format jsonl {note_id, prompt, completion, ...}")
    p.add_argument("--notes", help="answer only these notes (e.g. the test notes of a teacher trace file)")
    p.add_argument("--inventory", help="codes the answers are restricted to (default: <artifacts>/data/inventory.jsonl)")
    p.add_argument("--max-new-tokens", type=int, help="default: params simulator.max_new_tokens")
    p.add_argument("--batch", type=int, help="texts per generation batch (default: params simulator.predict_batch)")
    p.add_argument("--threads", type=int, help="intra-op threads (default: params models.threads)")
    p.add_argument("--out", required=True,
                   help="jsonl {note_id, with_rationale, note_only, rationale_only} (fidelity --simulator)")
    p.set_defaults(func=cmd_predict)
