"""`mistill world ...`: build the inventory, the notes, the corpora and the shortlists.

Every command reads the active profile through `mistill.params.load_params()`,
writes its artifacts atomically under `<paths.artifacts>/data/` and records a
`<name>.provenance.json` beside each (code version, the parameters read, seed).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from mistill.errors import UserError
from mistill.io import provenance, write_json
from mistill.params import load_params


def data_dir(params: dict[str, Any]) -> Path:
    return Path(params["paths"]["artifacts"]) / "data"


def _world(params: dict[str, Any], key: str) -> dict[str, Any]:
    section = params.get("world", {}).get(key)
    if not isinstance(section, dict):
        raise UserError(f"params.yaml: {params['profile']}.world.{key} is missing")
    return section


def _record(path: Path, params: dict[str, Any], read: dict[str, Any], seed: int | None, **extra: Any) -> None:
    write_json(path.with_name(path.name.rsplit(".", 1)[0] + ".provenance.json"),
               provenance(read, seed, profile=params["profile"], artifact=path.name, **extra))


# -- inventory
def build_inventory(params: dict[str, Any]):
    from mistill.world.inventory import demo_inventory
    from mistill.world.mimic import mimiciv_inventory

    cfg = _world(params, "inventory")
    seed = int(params["seeds"]["inventory_shuffle"])
    if cfg["source"] == "icd10cm":
        return demo_inventory(int(cfg["target_codes"]), seed, min_leaves=int(cfg["min_leaves"]),
                              max_leaves=int(cfg["max_leaves"]),
                              max_description_words=int(cfg["max_description_words"]))
    if cfg["source"] == "mimiciv":
        mimic = _world(params, "mimiciv")
        return mimiciv_inventory(mimic["table"], seed, descriptions=mimic.get("descriptions"))
    raise UserError(f"params.yaml: world.inventory.source must be icd10cm or mimiciv, got {cfg['source']!r}")


def cmd_inventory(args: argparse.Namespace) -> int:
    from mistill.world.inventory import write_inventory

    params = load_params()
    start = time.perf_counter()
    inventory = build_inventory(params)
    out = data_dir(params) / "inventory.jsonl"
    write_inventory(out, inventory)
    _record(out, params, {"world.inventory": _world(params, "inventory"), "seeds": params["seeds"]},
            int(params["seeds"]["inventory_shuffle"]), n_codes=len(inventory),
            n_categories=len(inventory.categories()), chapter_letters=list(inventory.chapter_letters()))
    print(f"{out}: {len(inventory)} codes, {len(inventory.categories())} categories, "
          f"{len(inventory.chapter_letters())} chapter letters ({time.perf_counter() - start:.1f}s)")
    return 0


# -- notes
def cmd_notes(args: argparse.Namespace) -> int:
    from mistill.world.demo_notes import NoteGeneratorConfig, generate_notes
    from mistill.world.inventory import load_inventory
    from mistill.world.mimic import mimiciv_notes
    from mistill.world.notes import validate_notes, write_notes

    params = load_params()
    start = time.perf_counter()
    cfg = _world(params, "notes")
    inventory_path = data_dir(params) / "inventory.jsonl"
    inventory = load_inventory(inventory_path)
    seed = int(cfg.get("seed", 0))
    if cfg["source"] == "synthetic":
        notes = generate_notes(inventory, NoteGeneratorConfig.from_params(cfg), seed)
    elif cfg["source"] == "mimiciv":
        mimic = _world(params, "mimiciv")
        notes = mimiciv_notes(mimic["table"], mimic["split_table"], inventory)
    else:
        raise UserError(f"params.yaml: world.notes.source must be synthetic or mimiciv, got {cfg['source']!r}")
    validate_notes(notes, inventory, source="notes")
    out = data_dir(params) / "notes.jsonl"
    write_notes(out, notes)
    _record(out, params, {"world.notes": cfg}, seed, n_notes=len(notes),
            n_patients=len({n.patient_id for n in notes}))
    print(f"{out}: {len(notes)} notes of {len({n.patient_id for n in notes})} patients "
          f"({time.perf_counter() - start:.1f}s)")
    return 0


# -- corpora
def build_corpora(params: dict[str, Any], notes, inventory) -> dict[str, Any]:
    """Select both corpora (App. A) and return the three note lists and the report, writing nothing."""
    from mistill.world.corpora import (
        Eligibility,
        characterization_traces,
        corpus_summary,
        prompt_note,
        select_characterization,
        select_distillation,
    )

    cfg = _world(params, "corpora")
    seed = int(params["seeds"]["corpus"])
    cut = bool(cfg["cut_discharge_diagnosis"])
    char_cfg, dt_cfg = cfg["char"], cfg["distill"]
    selection = select_characterization(
        notes, inventory, eligibility=Eligibility.from_params(char_cfg), size=int(char_cfg["size"]),
        source_split=char_cfg["source_split"], seed=seed)
    char = characterization_traces(selection, cut=cut,
                                   kept_section_variants=int(char_cfg.get("kept_section_variants", 0)))
    char_patients = {n.patient_id for n in selection.notes}
    train, test = select_distillation(
        notes, inventory, eligibility=Eligibility.from_params(dt_cfg), n_train=int(dt_cfg["n_train"]),
        n_test=int(dt_cfg["n_test"]), source_split=dt_cfg["source_split"],
        exclude_patients=char_patients, seed=seed)
    dt_train = [prompt_note(n, "train", cut=cut)[0] for n in train]
    dt_test = [prompt_note(n, "test", cut=cut)[0] for n in test]
    cuts = [{"note_id": n.note_id, "cuts": n.meta["section_cut"]} for n in char + dt_train + dt_test]
    report = {
        "characterization": {
            **corpus_summary(selection.notes, inventory),
            "n_traces": len(char),
            "n_eligible": selection.n_eligible,
            "code_count_cut_points": selection.cut_points,
            "per_stratum": {str(s): sum(1 for v in selection.strata.values() if v == s) for s in range(4)},
        },
        "dt_train": corpus_summary(train, inventory),
        "dt_test": corpus_summary(test, inventory),
        "section_cuts": {
            "n_notes_cut": sum(1 for c in cuts if c["cuts"]),
            "n_notes_without_section": sum(1 for c in cuts if c["cuts"] == []),
            "log": cuts,
        },
    }
    return {"corpus_char": char, "dt_train": dt_train, "dt_test": dt_test, "report": report}


def cmd_corpora(args: argparse.Namespace) -> int:
    from mistill.world.inventory import load_inventory
    from mistill.world.notes import load_notes, write_notes

    params = load_params()
    start = time.perf_counter()
    out_dir = data_dir(params)
    inventory = load_inventory(out_dir / "inventory.jsonl")
    notes = load_notes(out_dir / "notes.jsonl", inventory)
    built = build_corpora(params, notes, inventory)
    read = {"world.corpora": _world(params, "corpora"), "seeds.corpus": params["seeds"]["corpus"]}
    seed = int(params["seeds"]["corpus"])
    for name in ("corpus_char", "dt_train", "dt_test"):
        write_notes(out_dir / f"{name}.jsonl", built[name])
    report = built["report"]
    seconds = time.perf_counter() - start   # printed, not stored: the report's bytes must not vary by run
    report["provenance"] = provenance(read, seed, profile=params["profile"])
    write_json(out_dir / "corpus_report.json", report)
    char = report["characterization"]
    print(f"{out_dir}: corpus_char {char['n_traces']} traces of {char['n_notes']} notes "
          f"({char['n_blocks']} blocks, {char['n_icd_chapters']} ICD-10-CM chapters), "
          f"dt_train {len(built['dt_train'])}, dt_test {len(built['dt_test'])} ({seconds:.1f}s)")
    return 0


# -- shortlists (RT-003)
def cmd_shortlists(args: argparse.Namespace) -> int:
    import numpy as np
    from tqdm import tqdm

    from mistill.io import read_jsonl, write_jsonl
    from mistill.world.inventory import load_inventory
    from mistill.world.notes import load_notes
    from mistill.world.shortlist import (
        Retriever,
        RetrieverConfig,
        build_shortlist,
        choose_k,
        macro_recall,
        recall_sweep,
        retriever_training_notes,
    )

    params = load_params()
    start = time.perf_counter()
    cfg = _world(params, "shortlist")
    out_dir = data_dir(params)
    out = out_dir / ("shortlists_rerun.jsonl" if args.rerun else "shortlists.jsonl")
    stored = out_dir / "shortlists.jsonl"
    if out == stored and stored.exists() and not args.regenerate:
        # App. A: a re-run does not reproduce the stored shortlists exactly; never overwrite them silently.
        raise UserError(f"{stored} exists; shortlists are stored, not regenerated "
                        "(pass --regenerate to replace them, or --rerun to compare a re-run)")
    inventory = load_inventory(out_dir / "inventory.jsonl")
    pool = load_notes(out_dir / "notes.jsonl", inventory)
    corpora = {name: load_notes(out_dir / f"{name}.jsonl", inventory)
               for name in ("corpus_char", "dt_train", "dt_test")}
    excluded = {n.patient_id for notes in corpora.values() for n in notes}
    train = retriever_training_notes(pool, split=str(cfg["train_split"]), exclude_patients=excluded)
    retriever = Retriever(inventory, RetrieverConfig.from_params(cfg)).fit(train)
    targets = [n for notes in corpora.values() for n in notes]
    rankings = {n.note_id: retriever.ranking(n) for n in tqdm(targets, desc="shortlists", unit="note")}
    groups = {"validation": corpora["corpus_char"], "corpus": corpora["dt_train"] + corpora["dt_test"],
              "test": corpora["dt_test"]}
    sibling_top = int(cfg["sibling_top"])
    sweep = recall_sweep(groups, rankings, inventory, k_grid=[int(k) for k in cfg["k_grid"]],
                         sibling_top=sibling_top)
    k, reached = choose_k(sweep, target=float(cfg["recall_target"]), groups=["validation", "corpus"])
    n_ranked = max(20, sibling_top)
    rows = [{"note_id": n.note_id,
             "codes": build_shortlist(rankings[n.note_id], inventory, k=k, sibling_top=sibling_top),
             "k": k, "ranked": rankings[n.note_id][:n_ranked]} for n in targets]
    shortlists = {r["note_id"]: r["codes"] for r in rows}
    report = {
        "k": k, "sibling_top": sibling_top, "target_reached": reached,
        "recall_target": float(cfg["recall_target"]),
        "completed_recall": {g: macro_recall(notes, shortlists) for g, notes in groups.items()},
        "shortlist_length": {"median": float(np.median([len(c) for c in shortlists.values()])),
                             "max": max(len(c) for c in shortlists.values()),
                             "inventory": len(inventory)},
        "n_retriever_train_notes": len(train), "n_trained_codes": int(retriever.trained_codes.sum()),
        "sweep": sweep,
    }
    if args.rerun and stored.exists():
        previous = {r["note_id"]: r["codes"] for r in read_jsonl(stored)}
        common = [i for i in shortlists if i in previous]
        jaccard = [len(set(shortlists[i]) & set(previous[i])) / len(set(shortlists[i]) | set(previous[i]))
                   for i in common]
        report["rerun"] = {"n_notes": len(common),
                           "exact_match": sum(shortlists[i] == previous[i] for i in common),
                           "median_jaccard": float(np.median(jaccard)) if jaccard else None}
    seconds = time.perf_counter() - start   # printed, not stored: the report's bytes must not vary by run
    report["provenance"] = provenance({"world.shortlist": cfg}, None, profile=params["profile"])
    write_jsonl(out, rows)
    write_json(out.with_name(out.stem + "_recall.json"), report)
    print(f"{out}: {len(rows)} shortlists, K={k} (+ siblings of top {sibling_top}), completed recall "
          + ", ".join(f"{g} {v:.3f}" for g, v in report["completed_recall"].items())
          + f", median length {report['shortlist_length']['median']:.0f} ({seconds:.1f}s)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    sub = subparsers.add_parser("inventory", help="the inventory in the shared order -> data/inventory.jsonl")
    sub.set_defaults(func=cmd_inventory)
    sub = subparsers.add_parser("notes", help="the note pool with gold codes -> data/notes.jsonl")
    sub.set_defaults(func=cmd_notes)
    sub = subparsers.add_parser("corpora", help="characterization and distillation corpora (App. A) -> "
                                "data/corpus_char.jsonl, dt_train.jsonl, dt_test.jsonl, corpus_report.json")
    sub.set_defaults(func=cmd_corpora)
    sub = subparsers.add_parser("shortlists", help="RT-003 shortlists of every corpus note -> "
                                "data/shortlists.jsonl, shortlists_recall.json")
    group = sub.add_mutually_exclusive_group()
    group.add_argument("--regenerate", action="store_true", help="replace stored shortlists")
    group.add_argument("--rerun", action="store_true",
                       help="write shortlists_rerun.jsonl and compare it with the stored shortlists")
    sub.set_defaults(func=cmd_shortlists)
