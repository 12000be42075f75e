"""The training arms under one trainer (App. J.2): Vanilla CoT-KD and Mistill.

* Vanilla CoT-KD: L_CoT alone = token cross-entropy on the teacher trace + lambda_KL (= 1) times the
  KL from the teacher's stored top-32 distribution (ULD instead when the student's tokenization of
  the trace is not the teacher's, as for SmolLM3-3B).
* Mistill: L_CoT + lambda_P1 (attention + interaction at P1 rows) + lambda_P2 (the same at P2 and
  at P2C rows), Eq. F of mistill.distill.objective; `terms` / `write_norm` keep the removed write term.

`NoteBatch` holds one note's student inputs and its aligned teacher targets; `note_loss` is the
only place that wires a forward pass to the pure loss functions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from mistill.distill import buckets as bk
from mistill.distill import objective as obj
from mistill.distill.alignment import window_rows
from mistill.distill.mechanism import NoteView, note_view, plan_rows, read_mechanism
from mistill.distill.pooled_attention import RowPlan, SupervisedRows
from mistill.distill.pools import Pool
from mistill.errors import UserError

ARMS = ("vanilla", "mistill")


@dataclass
class ArmConfig:
    arm: str = "mistill"
    lambda_p1: float = 0.1
    lambda_p2: float = 0.1
    terms: tuple[str, ...] = ("attn", "inter")
    write_norm: bool = False
    window: int = 8
    kl_weight: float = 1.0
    event_weight: float = 1.0   # App. M.1 evw4: CE and KL times this at the teacher's event and window rows
    eps: float = 1e-6
    logit_chunk: int = 256
    row_chunk: int = 256

    def __post_init__(self):
        if self.arm not in ARMS:
            raise UserError(f"unknown arm {self.arm!r}; known: {', '.join(ARMS)}")
        unknown = set(self.terms) - obj.ALL_TERMS
        if unknown:
            raise UserError(f"unknown --terms {sorted(unknown)}; known: {sorted(obj.ALL_TERMS)}")
        if not self.event_weight > 0:
            raise UserError(f"--event-weight must be positive, not {self.event_weight}")

    def as_dict(self) -> dict:
        """The arm as its runs record it; an event weight of 1 (no up-weighting) is left out."""
        return recorded_fields(self, {"event_weight": 1.0})


def recorded_fields(config, left_out: dict) -> dict:
    """A config's fields as its runs record them: each field of `left_out` is dropped while it holds the value
    given there (its default), so runs trained before the field existed keep their identity (trainer.RUN_IDENTITY)."""
    out = asdict(config)
    for name, default in left_out.items():
        if out[name] == default:
            del out[name]
    return out


@dataclass
class NoteBatch:
    note_id: str
    ids: torch.Tensor                     # [T]
    labels: torch.Tensor                  # [T], -100 outside the completion; label t is token t+1
    top_ids: torch.Tensor | None          # [T, k] in the student's vocabulary (KL) or None
    top_logprobs: torch.Tensor | None     # [T, k]
    uld: bool
    view: NoteView | None = None
    events: list[dict] = field(default_factory=list)
    teacher: dict = field(default_factory=dict)   # phase -> arrays; "window" -> arrays
    token_weights: torch.Tensor | None = None     # [T] per label position (event up-weighting), None: all 1


def _map_top_ids(top_ids: np.ndarray, top_logp: np.ndarray, teacher_tok, student_tok):
    """Teacher top-k ids -> the student's ids for the same token text; unmapped entries get -inf."""
    mapping: dict[int, int | None] = {}
    for tid in np.unique(top_ids):
        ids = student_tok.encode(teacher_tok.decode([int(tid)])).ids
        mapping[int(tid)] = ids[0] if len(ids) == 1 else None
    sid = np.vectorize(lambda t: -1 if mapping[int(t)] is None else mapping[int(t)])(top_ids)
    logp = np.where(sid >= 0, top_logp, -np.inf).astype(np.float32)
    return np.where(sid >= 0, sid, 0).astype(np.int64), logp


def prepare_note(meta: dict, arrays: dict, student_tok, teacher_tok, arm: ArmConfig) -> NoteBatch:
    """The student's view of one note's teacher targets; refuses a note the student cannot be trained on."""
    note_id = meta["note_id"]
    axis = bk.build_axis(meta["prompt"], meta["completion"])
    view = note_view(student_tok, axis, meta["events"], meta["competitors"])
    ids = torch.tensor(view.ids)
    labels = torch.full_like(ids, -100)
    first = view.completion_token
    if first >= len(view.ids):
        raise UserError(f"note {note_id}: the student's tokenization leaves no completion tokens")
    labels[first - 1:-1] = ids[first:]
    student_offsets = np.asarray([(s - view.completion_at, e - view.completion_at) for s, e in view.offsets[first:]])
    same = student_offsets.shape == arrays["completion_offsets"].shape and \
        bool((student_offsets == arrays["completion_offsets"]).all())
    top_ids = top_logp = None
    T, k = len(view.ids), arrays["top_ids"].shape[1]
    full_ids = np.zeros((T, k), dtype=np.int64)
    full_logp = np.full((T, k), -np.log(k), dtype=np.float32)
    if same:
        sid, slogp = _map_top_ids(arrays["top_ids"], arrays["top_logprobs"], teacher_tok, student_tok)
        full_ids[first - 1:T - 1], full_logp[first - 1:T - 1] = sid, slogp
    else:
        # ULD pairs the teacher's and the student's completion tokens by index, truncated to the shorter
        n = min(T - first, arrays["top_logprobs"].shape[0])
        full_logp[first - 1:first - 1 + n] = arrays["top_logprobs"][:n]
        labels_uld = labels.clone()
        labels_uld[first - 1 + n:] = -100
        labels = labels_uld if n < T - first else labels
    top_ids, top_logp = torch.from_numpy(full_ids), torch.from_numpy(full_logp)
    batch = NoteBatch(note_id, ids, labels, top_ids, top_logp, uld=not same)
    if arm.event_weight != 1.0:
        batch.token_weights = event_weights(view, len(view.ids), arm)
    if arm.arm == "mistill":
        if not view.realized:
            raise UserError(f"note {note_id}: the student's tokenizer ({getattr(student_tok, 'name', '?')}) "
                            "realises none of the note's teacher events; nothing to supervise")
        batch.view, batch.events = view, meta["events"]
        batch.teacher = {p: {k2: arrays[f"{p}_{k2}"] for k2 in ("rows", "m", "c", "event_index")}
                         for p in ("P1", "P2", "P2C") if f"{p}_rows" in arrays}
        if "window_rows" in arrays:
            batch.teacher["window"] = {k2: arrays[f"window_{k2}"] for k2 in ("rows", "event_index", "distance")}
    return batch


def event_weights(view: NoteView, length: int, arm: ArmConfig) -> torch.Tensor:
    """[T] weights of the label positions: `arm.event_weight` at each realised event's decision row (label q
    predicts the event token q + 1) and at the W window rows before each P1 event, 1 elsewhere (App. M.1: the
    token loss up-weighted "at the same events and window positions" Mistill supervises)."""
    weights = torch.ones(length)
    rows = {ev.row for ev in view.realized}
    rows |= {r for ev in view.realized if ev.kind == "P1" for r in window_rows(ev.row, arm.window)}
    weights[sorted(rows)] = arm.event_weight
    return weights


def cot_loss(model, hidden: torch.Tensor, batch: NoteBatch, arm: ArmConfig) -> tuple[torch.Tensor, dict]:
    """L_CoT over the trace tokens, vocabulary logits computed chunk by chunk under checkpointing."""
    device = hidden.device
    scored = torch.nonzero(batch.labels != -100).flatten()
    ce_total, kl_total, n_total = hidden.new_zeros((), dtype=torch.float32), hidden.new_zeros((), dtype=torch.float32), 0
    kl_weight = arm.kl_weight if batch.top_logprobs is not None else 0.0
    extra = [] if batch.token_weights is not None else None   # what the event weights add, one entry per chunk
    for start in range(0, len(scored), arm.logit_chunk):
        pos = scored[start:start + arm.logit_chunk].to(device)
        labels = batch.labels.to(device)[pos]
        t_ids = batch.top_ids.to(device)[pos]
        t_logp = batch.top_logprobs.to(device)[pos]
        weights = None if extra is None else batch.token_weights.to(device)[pos]

        def chunk_loss(h, labels=labels, t_ids=t_ids, t_logp=t_logp, weights=weights):
            logits = model.lm_head(h)
            if weights is None:
                ce, kl, _ = obj.cot_loss_sums(logits, labels, t_ids, t_logp, kl_weight=kl_weight, uld=batch.uld)
                return ce, kl
            ce, kl, _, added = obj.weighted_cot_loss_sums(logits, labels, weights, t_ids, t_logp,
                                                          kl_weight=kl_weight, uld=batch.uld)
            extra.append(added)   # read below, before backward's recompute appends again
            return ce, kl

        h = hidden.index_select(0, pos)
        ce, kl = checkpoint(chunk_loss, h, use_reentrant=False) if torch.is_grad_enabled() else chunk_loss(h)
        ce_total, kl_total, n_total = ce_total + ce, kl_total + kl, n_total + len(pos)
    n = max(n_total, 1)
    ce, kl = ce_total / n, kl_total / n
    log = {"ce": float(ce.detach()), "kl": float(kl.detach()), "tokens": n_total}
    if extra is not None:
        log["event_extra"] = sum(extra) / n
    return ce + kl, log


def aligned_events(student_index: torch.Tensor, teacher_index: np.ndarray):
    """Positions in the student's and teacher's arrays of the events both hold, in student order."""
    where = {int(e): i for i, e in enumerate(teacher_index)}
    pairs = [(i, where[int(e)]) for i, e in enumerate(student_index.tolist()) if int(e) in where]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def mechanism_terms(mech: dict, batch: NoteBatch, arm: ArmConfig, device) -> dict[str, dict[str, torch.Tensor]]:
    """Per-phase objective terms of one note from the student's pooled quantities `mech`
    (mistill.distill.mechanism.read_mechanism) and the note's teacher targets."""
    per_phase: dict[str, dict[str, torch.Tensor]] = {}
    for phase in ("P1", "P2", "P2C"):
        s, t = mech[phase], batch.teacher.get(phase)
        if s is None or t is None:
            continue
        si, ti = aligned_events(s["event_index"], t["event_index"])
        if not si:
            continue
        s_rows, t_rows = s["rows"][si], torch.from_numpy(t["rows"][ti]).to(device)
        if phase == "P1" and mech["window"] is not None and "window" in batch.teacher:
            # window rows are paired by (event, token distance before it): App. I.1
            sw, tw = mech["window"], batch.teacher["window"]
            t_key = {(int(e), int(d)): i for i, (e, d) in enumerate(zip(tw["event_index"], tw["distance"]))}
            pairs = [(i, t_key[(int(e), int(d))]) for i, (e, d) in
                     enumerate(zip(sw["event_index"].tolist(), sw["distance"].tolist())) if (int(e), int(d)) in t_key]
            if pairs:
                s_rows = torch.cat([s_rows, sw["rows"][[p[0] for p in pairs]]])
                t_rows = torch.cat([t_rows, torch.from_numpy(tw["rows"][[p[1] for p in pairs]]).to(device)])
        per_phase[phase] = obj.phase_loss(
            teacher_rows=t_rows, student_rows=s_rows,
            m_teacher=torch.from_numpy(t["m"][ti]).to(device), c_teacher=torch.from_numpy(t["c"][ti]).to(device),
            m_student=s["m"][si], c_student=s["c"][si], terms=arm.terms, write_norm=arm.write_norm, eps=arm.eps)
    return per_phase


def note_loss(model, batch: NoteBatch, arm: ArmConfig, pools: dict[str, Pool] | None = None,
              rows_hook: SupervisedRows | None = None) -> tuple[torch.Tensor, dict]:
    """One note's loss under the arm, and a log of its pieces (`notes_loss` of a group of one)."""
    return notes_loss(model, [batch], arm, pools, rows_hook)[0]


def padded_ids(batches: list[NoteBatch], pad_id: int, device) -> torch.Tensor:
    """[B, T_max] the notes' token ids, each right-padded to the longest with `pad_id`."""
    ids = torch.full((len(batches), max(len(b.ids) for b in batches)), pad_id, dtype=batches[0].ids.dtype)
    for row, batch in enumerate(batches):
        ids[row, :len(batch.ids)] = batch.ids
    return ids.to(device)


def notes_forward(model, batches: list[NoteBatch], arm: ArmConfig, pools: dict[str, Pool] | None = None,
                  rows_hook: SupervisedRows | None = None):
    """The notes' one padded forward: the final hidden states [B, T_max, D] and, for Mistill, each note's row
    plan, whose pooled rows `rows_hook` recorded (read them with `read_mechanism(model, plan, rows_hook, row)`)."""
    device = next(model.parameters()).device
    lengths = [len(b.ids) for b in batches]
    ids = padded_ids(batches, model.config.pad_token_id or 0, device)
    plans = None
    if arm.arm == "mistill":
        plans = [plan_rows(b.view, b.events, pools, pools["P1"], arm.window, device) for b in batches]
        rows_hook.arm_rows([RowPlan(p.requests, p.n_buckets, n) for p, n in zip(plans, lengths)])
    try:
        hidden = model.model(input_ids=ids).last_hidden_state
    finally:
        if rows_hook is not None:
            rows_hook.stop_recording()
    return hidden, plans


def notes_loss(model, batches: list[NoteBatch], arm: ArmConfig, pools: dict[str, Pool] | None = None,
               rows_hook: SupervisedRows | None = None) -> list[tuple[torch.Tensor, dict]]:
    """Each note's loss under the arm and a log of its pieces, the notes in one forward.

    The notes are right-padded to the longest.  Attention is causal, so no real position sees the
    padding and each row's hidden states are those of the note's own forward (to the rounding of a
    larger matrix product); every loss is then computed over the note's own length, as for a note
    alone.  For Mistill, `rows_hook` (SupervisedRows on the student's pooled layers) computes each
    note's pooled rows inside the forward; it stays armed until the next group so the backward
    recompute finds the same plans.
    """
    device = next(model.parameters()).device
    lengths = [len(b.ids) for b in batches]
    hidden, plans = notes_forward(model, batches, arm, pools, rows_hook)
    out = []
    for row, (batch, length) in enumerate(zip(batches, lengths)):
        cot, log = cot_loss(model, hidden[row, :length], batch, arm)
        if arm.arm == "vanilla":
            out.append((cot, {"loss": float(cot.detach()), "cot": float(cot.detach()), **log}))
            continue
        per_phase = mechanism_terms(read_mechanism(model, plans[row], rows_hook, row), batch, arm, device)
        total = obj.mistill_loss(cot, per_phase, arm.lambda_p1, arm.lambda_p2)
        log.update({"loss": float(total.detach()), "cot": float(cot.detach())})
        for phase, terms in per_phase.items():
            for name, value in terms.items():
                log[f"{phase}_{name}"] = float(value.detach())
        log["attn"] = sum(v for k, v in log.items() if k.endswith("_attn"))
        out.append((total, log))
    return out
