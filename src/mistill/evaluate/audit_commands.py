"""`mistill evaluate audit-frame | audit-labels` (App. C's blinded audit of contrastive events; R-C9).

    audit-frame    the stratified frame, the blinded sheet and its key      -> <audit.out_dir>/
    audit-labels   the labels, checked against the key                      -> <audit.out_dir>/labels.csv
                   (params audit.labels: "generator" under the demo, else the CSV a labeller filled in)

Hooked into `mistill evaluate` by `mistill.evaluate.commands.register`.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def _params():
    from mistill.params import load_params

    return load_params()


def cmd_audit_frame(args) -> int:
    from tqdm import tqdm

    from mistill.evaluate import audit
    from mistill.evaluate.own_heads import realize_note_events
    from mistill.instrument.passes import load_traces
    from mistill.io import provenance, read_jsonl
    from mistill.models.loading import load_tokenizer
    from mistill.world.notes import load_notes

    params = _params()
    cfg = audit.AuditConfig.from_params(params)
    notes = {n.note_id: n for n in load_notes(cfg.test_notes)}
    traces = [t for t in load_traces(cfg.traces) if t.note_id in notes]
    teacher_tokenizer = load_tokenizer(params["models"]["teacher"])
    students = [load_tokenizer(spec) for spec in params["distill"]["students"].values()]
    realised: dict[str, set[int]] = {}
    for trace in tqdm(traces, desc="audit frame: realise events", unit="note"):
        path = Path(cfg.events_dir) / trace.note_id / "events.jsonl"
        if not path.exists():   # a note without events has no contrastive event to audit
            continue
        events = read_jsonl(path)
        anchors = [{e.anchor for e in realize_note_events(events, teacher_tokenizer, tok, trace)[1] if e.kind == "P2C"}
                   for tok in students]
        realised[trace.note_id] = set.intersection(*anchors) if anchors else set()
    population = audit.contrastive_events(traces, notes, cfg.events_dir, realised)
    frame = audit.draw_frame(population, cfg.n_events, cfg.seed)
    sheet, key = audit.sheet_rows(frame, {t.note_id: t.completion for t in traces}, cfg.seed, cfg.context_lines)
    audit.write_frame_outputs(cfg, frame, sheet, key, provenance(params, cfg.seed))
    print(f"audit frame: {len(key)} of {len(population)} contrastive events in "
          f"{sum(1 for n in frame['sample'].values() if n)} strata -> {cfg.path('sheet.csv')}")
    return 0


def cmd_audit_labels(args) -> int:
    from mistill.errors import UserError
    from mistill.evaluate import audit
    from mistill.instrument.passes import load_traces
    from mistill.io import read_json
    from mistill.world.commands import data_dir
    from mistill.world.inventory import load_inventory
    from mistill.world.notes import load_notes

    params = _params()
    cfg = audit.AuditConfig.from_params(params)
    key = read_json(cfg.path("key.json"), "audit key")
    out = cfg.path("labels.csv")
    if cfg.labels == "generator":
        notes = {n.note_id: n for n in load_notes(cfg.test_notes)}
        traces = {t.note_id: t for t in load_traces(cfg.traces)}
        inventory = load_inventory(args.inventory or data_dir(params) / "inventory.jsonl")
        audit.write_csv(out, audit.generator_labels(key, notes, traces, inventory), audit.LABEL_COLUMNS)
    else:
        audit.read_labels(cfg.labels, key)   # check before copying: a bad file never lands
        if not out.exists() or out.resolve() != Path(cfg.labels).resolve():
            shutil.copyfile(cfg.labels, out)
    labels = audit.read_labels(out, key)
    if not labels:
        raise UserError(f"{out}: no labels")
    counts = {label: sum(x == label for x, _ in labels.values()) for label in audit.LABELS}
    print(f"audit labels: {len(labels)} items (" + ", ".join(f"{k} {v}" for k, v in counts.items()) + f") -> {out}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("audit-frame", help="the audit's stratified frame, blinded sheet and key (App. C)")
    p.set_defaults(func=cmd_audit_frame)
    p = subparsers.add_parser("audit-labels", help="the audit's labels, checked against the key (App. C)")
    p.add_argument("--inventory", help="the generator labeller's inventory (default: <artifacts>/data/inventory.jsonl)")
    p.set_defaults(func=cmd_audit_labels)
