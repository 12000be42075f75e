"""The off-policy baseline arms of Table 2 under the shared trainer (App. J.2, J.3): Feature-KD and DistiLLM-2.

Both run on Mistill's trainer and recipe (`mistill.distill.trainer`: data order, optimiser, schedule,
clipping, precision, resumable checkpoints, `config.json` and `metrics.jsonl`), and both need the
teacher online: its forward runs under `no_grad` beside the student's, on the same note.

* Feature-KD (`FeatureKDTrainer`), the loss of `mistill.baselines.feature_kd`:
      L = L_CoT + 1 * L_attn + 1 * L_hid
  L_CoT is Vanilla CoT-KD's (cross-entropy plus the top-32 KL, ULD where the tokenizations differ),
  from the same stored teacher targets.  The attention rows of every head of each paired layer are
  recomputed at the sampled rows by `SupervisedRows` in both models (uniform pools); the hidden
  states are the residual stream leaving each paired block (`LayerInputCapture`).
  Positions are paired by text [ours]: a student trace token and a teacher trace token are the same
  position when both end at the same character of the completion.  With one tokenizer (Qwen3-4B)
  that is every token; across tokenizers (SmolLM3-3B) it is every boundary both tokenizations share.
  The 64 attention rows are drawn once per note from the paired positions with a generator seeded
  by (training seed, note's index) [ours: the paper fixes only that the seed fixes the draw], and
  the adapters are built right after seeding torch with the training seed (App. J.3's caveat fixed).
* DistiLLM-2 (`DistiLLM2Trainer`), CALD of `mistill.baselines.distillm2` at its published settings
  (alpha 0.1, beta 1), alone, as the official recipe trains it: the teacher's trace is the preferred
  response, the untrained student's own generation for the same prompt the dispreferred one.  It is
  defined for a shared vocabulary only; a student whose tokenizer is not the teacher's is refused.
  Vocabulary logits are formed chunk by chunk under checkpointing, as L_CoT's are.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from mistill.baselines import distillm2 as dm2
from mistill.baselines import feature_kd as fkd
from mistill.distill import buckets as bk
from mistill.distill.arms import ArmConfig, NoteBatch, cot_loss, prepare_note
from mistill.distill.mechanism import NoteView, note_view
from mistill.distill.pooled_attention import LayerInputCapture, SupervisedRows
from mistill.distill.trainer import Trainer
from mistill.errors import UserError

BASELINE_ARMS = ("featurekd", "distillm2")


@dataclass
class FeatureKDConfig:
    arm: str = "featurekd"
    positions: int = fkd.N_POSITIONS
    layer_pairs: int = fkd.N_PAIRS
    attn_weight: float = fkd.ATTN_WEIGHT
    hidden_weight: float = fkd.HIDDEN_WEIGHT
    kl_weight: float = 1.0          # L_CoT's top-32 KL, as Vanilla CoT-KD's
    eps: float = 1e-6
    logit_chunk: int = 256

    def as_dict(self) -> dict:
        return asdict(self)

    def cot_arm(self) -> ArmConfig:
        return ArmConfig(arm="vanilla", kl_weight=self.kl_weight, logit_chunk=self.logit_chunk, window=0)


@dataclass
class DistiLLM2Config:
    arm: str = "distillm2"
    alpha: float = dm2.DEFAULT_ALPHA
    beta: float = dm2.DEFAULT_BETA
    logit_chunk: int = 256

    def as_dict(self) -> dict:
        return asdict(self)


# ---- Feature-KD ------------------------------------------------------------------------------------------

def paired_trace_positions(student: NoteView, teacher: NoteView) -> tuple[np.ndarray, np.ndarray]:
    """(student positions, teacher positions) of the trace tokens both views end at the same character
    of the completion, in order."""
    def ends(view: NoteView) -> dict[int, int]:
        return {end - view.completion_at: i for i, (_, end) in enumerate(view.offsets)
                if i >= view.completion_token and end > view.completion_at}

    s_ends, t_ends = ends(student), ends(teacher)
    shared = sorted(set(s_ends) & set(t_ends))
    return np.asarray([s_ends[c] for c in shared], dtype=np.int64), np.asarray([t_ends[c] for c in shared], dtype=np.int64)


@dataclass
class FeatureKDNote:
    cot: NoteBatch                   # the student's L_CoT inputs (Vanilla CoT-KD's)
    teacher_ids: torch.Tensor        # [T_T]
    student_pos: torch.Tensor        # [P] paired trace positions (hidden-state term)
    teacher_pos: torch.Tensor        # [P]
    student_rows: torch.Tensor       # [R] sampled among the paired positions (attention term)
    teacher_rows: torch.Tensor       # [R]
    student_buckets: torch.Tensor    # [T_S] base bucket of every token
    teacher_buckets: torch.Tensor    # [T_T]
    n_buckets: int

    @property
    def note_id(self) -> str:
        return self.cot.note_id


def prepare_featurekd_note(meta: dict, arrays: dict, student_tok, teacher_tok, config: FeatureKDConfig,
                           seed: int, index: int) -> FeatureKDNote:
    """One note's Feature-KD inputs; `index` is the note's place in the training set (the row draw's key)."""
    cot = prepare_note(meta, arrays, student_tok, teacher_tok, config.cot_arm())
    axis = bk.build_axis(meta["prompt"], meta["completion"])
    s_view = note_view(student_tok, axis, [], [])
    t_view = note_view(teacher_tok, axis, [], [])
    s_pos, t_pos = paired_trace_positions(s_view, t_view)
    if len(s_pos) == 0:
        raise UserError(f"note {meta['note_id']}: the student's and the teacher's tokenizations share no trace "
                        "position; Feature-KD has nothing to match")
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, index]).generate_state(1)[0]))
    pick = fkd.sample_positions(torch.arange(len(s_pos)), config.positions, generator)
    return FeatureKDNote(cot, torch.tensor(t_view.ids), torch.from_numpy(s_pos), torch.from_numpy(t_pos),
                         torch.from_numpy(s_pos)[pick], torch.from_numpy(t_pos)[pick],
                         torch.from_numpy(s_view.tokens.base_index), torch.from_numpy(t_view.tokens.base_index),
                         axis.n_buckets)


class _FeatureReader:
    """Hooks on one model's paired layers: bucket-pooled head-averaged rows and residual streams."""

    def __init__(self, model: torch.nn.Module, layers: list[int]):
        self.model, self.layers = model, list(layers)
        self.n_layers = len(model.model.layers)
        self.n_heads = int(model.config.num_attention_heads)
        self.rows_hook = SupervisedRows(model, self.layers)
        # the residual stream leaving block l is block l + 1's input, or the final norm's for the last block
        self.capture = LayerInputCapture(model, [layer + 1 for layer in self.layers if layer + 1 < self.n_layers])

    def forward(self, ids: torch.Tensor, rows: torch.Tensor, buckets: torch.Tensor, n_buckets: int,
                positions: torch.Tensor):
        """(last hidden state [T, D], rows per layer [[R, B]], residual streams per layer [[P, D]])."""
        device = ids.device
        self.rows_hook.arm(fkd.attention_requests(self.layers, self.n_heads, rows.to(device), buckets.to(device)),
                           n_buckets)
        self.capture.start()
        try:
            hidden = self.model.model(input_ids=ids[None]).last_hidden_state[0]
        finally:
            self.rows_hook.stop_recording()
            self.capture.stop()
        collected = self.rows_hook.collect()
        pooled = [collected[f"fkd:{layer}"][0] for layer in self.layers]
        streams = [(self.capture.inputs[layer + 1] if layer + 1 < self.n_layers else self.capture.final_input)[0]
                   .index_select(0, positions.to(device)) for layer in self.layers]
        if not torch.is_grad_enabled():
            # no backward will recompute these layers: disarm, so the model's later forwards run plain
            self.rows_hook.release()
            self.capture.start()
            self.capture.stop()
        return hidden, pooled, streams


class FeatureKDTrainer(Trainer):
    """The shared trainer with Feature-KD's loss, the teacher online and one adapter per layer pair."""

    def __init__(self, model, teacher, notes: list[FeatureKDNote], config: FeatureKDConfig, train_cfg, out_dir, **kw):
        pairs = fkd.uniform_layer_pairs(len(model.model.layers), len(teacher.model.layers), config.layer_pairs)
        torch.manual_seed(train_cfg.seed)   # the seed fixes the adapters' initialisation (App. J.3's caveat)
        adapter = fkd.LinearAdapter(int(model.config.hidden_size), int(teacher.config.hidden_size), len(pairs))
        super().__init__(model, notes, config, train_cfg, out_dir, extra=adapter, **kw)
        self.config, self.cot_arm, self.layer_pairs = config, config.cot_arm(), pairs
        self.teacher = teacher.eval().requires_grad_(False)
        self.student_reader = _FeatureReader(self.model, [s for s, _ in pairs])
        self.teacher_reader = _FeatureReader(self.teacher, [t for _, t in pairs])
        self.run_config["layer_pairs"] = [list(p) for p in pairs]

    def note_loss(self, note: FeatureKDNote) -> tuple[torch.Tensor, dict]:
        teacher_device = next(self.teacher.parameters()).device
        with torch.no_grad():
            _, t_rows, t_hidden = self.teacher_reader.forward(note.teacher_ids.to(teacher_device), note.teacher_rows,
                                                              note.teacher_buckets, note.n_buckets, note.teacher_pos)
        hidden, s_rows, s_hidden = self.student_reader.forward(note.cot.ids.to(self.device), note.student_rows,
                                                               note.student_buckets, note.n_buckets, note.student_pos)
        cot, log = cot_loss(self.model, hidden, note.cot, self.cot_arm)
        terms = fkd.feature_kd_terms(
            teacher_rows=[r.to(self.device).float() for r in t_rows], student_rows=[r.float() for r in s_rows],
            teacher_hidden=[h.to(self.device) for h in t_hidden], student_hidden=s_hidden,
            mask=torch.ones(len(note.student_pos), device=self.device), adapter=self.extra,
            eps_attn=self.config.eps, eps_rms=self.config.eps)
        total = fkd.feature_kd_loss(cot, terms, self.config.attn_weight, self.config.hidden_weight)
        log.update({"loss": float(total.detach()), "cot": float(cot.detach()),
                    "attn": float(terms["attn"].detach()), "hidden": float(terms["hidden"].detach())})
        return total, log


# ---- DistiLLM-2 ------------------------------------------------------------------------------------------

@dataclass
class DistiLLM2Note:
    note_id: str
    preferred: torch.Tensor          # [T1] the teacher's trace after the templated prompt
    preferred_mask: torch.Tensor     # [T1] rows whose next token is a response token
    dispreferred: torch.Tensor       # [T2] the untrained student's own generation for the prompt
    dispreferred_mask: torch.Tensor  # [T2]


def response_ids(tokenizer, prompt: str, completion: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The templated prompt followed by a response, and the mask of logits rows that predict a response token."""
    prefix = tokenizer.chat_prompt(prompt)
    enc = tokenizer.encode(prefix + completion)
    first = next((i for i, (s, _) in enumerate(enc.offsets) if s >= len(prefix)), len(enc.ids))
    mask = torch.zeros(len(enc.ids), dtype=torch.bool)
    if first < len(enc.ids):
        mask[max(first - 1, 0):len(enc.ids) - 1] = True
    return torch.tensor(enc.ids), mask


def check_shared_vocabulary(student, teacher, student_tok, teacher_tok, sample_text: str) -> None:
    """DistiLLM-2 compares distributions token by token: one vocabulary, one tokenization."""
    sizes = int(student.config.vocab_size), int(teacher.config.vocab_size)
    same_ids = student_tok.encode(sample_text).ids == teacher_tok.encode(sample_text).ids
    if sizes[0] != sizes[1] or not same_ids:
        raise UserError(f"DistiLLM-2 needs the teacher's vocabulary (App. J.3: Qwen3-4B only); the student's "
                        f"vocabulary has {sizes[0]} entries against the teacher's {sizes[1]}"
                        + ("" if same_ids else " and tokenizes the trace differently"))


def prepare_distillm2_note(trace: dict, response: dict, tokenizer) -> DistiLLM2Note:
    """`trace`: the teacher's row (note_id, prompt, completion); `response`: the untrained student's generation."""
    if response["prompt"] != trace["prompt"]:
        raise UserError(f"note {trace['note_id']}: the student's response was generated from another prompt than "
                        "the teacher's trace; regenerate the responses (stage DT-responses)")
    preferred, p_mask = response_ids(tokenizer, trace["prompt"], trace["completion"])
    dispreferred, d_mask = response_ids(tokenizer, trace["prompt"], response["completion"])
    if not p_mask.any():
        raise UserError(f"note {trace['note_id']}: the teacher's trace has no completion token")
    return DistiLLM2Note(trace["note_id"], preferred, p_mask, dispreferred, d_mask)


class DistiLLM2Trainer(Trainer):
    """The shared trainer with CALD alone and the teacher online."""

    def __init__(self, model, teacher, notes: list[DistiLLM2Note], config: DistiLLM2Config, train_cfg, out_dir, **kw):
        super().__init__(model, notes, config, train_cfg, out_dir, **kw)
        self.config = config
        self.teacher = teacher.eval().requires_grad_(False)

    def _response_term(self, ids: torch.Tensor, mask: torch.Tensor, per_token) -> tuple[torch.Tensor, int]:
        """sum over the response rows of per_token(teacher logits, student logits), and the row count."""
        teacher_device = next(self.teacher.parameters()).device
        with torch.no_grad():
            t_hidden = self.teacher.model(input_ids=ids.to(teacher_device)[None]).last_hidden_state[0]
        s_hidden = self.model.model(input_ids=ids.to(self.device)[None]).last_hidden_state[0]
        rows = torch.nonzero(mask).flatten()
        total = s_hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, len(rows), self.config.logit_chunk):
            pos = rows[start:start + self.config.logit_chunk]
            with torch.no_grad():
                t_logits = self.teacher.lm_head(t_hidden.index_select(0, pos.to(teacher_device))).to(self.device)

            def chunk(h, t_logits=t_logits):
                return per_token(t_logits, self.model.lm_head(h)).float().sum()

            h = s_hidden.index_select(0, pos.to(self.device))
            total = total + (checkpoint(chunk, h, use_reentrant=False) if torch.is_grad_enabled() else chunk(h))
        return total, len(rows)

    def note_loss(self, note: DistiLLM2Note) -> tuple[torch.Tensor, dict]:
        alpha, beta = self.config.alpha, self.config.beta
        skl_sum, n_pref = self._response_term(
            note.preferred, note.preferred_mask, lambda t, s: dm2.skew_forward_kl_per_token(t, s, alpha))
        skl = skl_sum / n_pref
        total = (2.0 - beta) * skl
        log = {"skl": float(skl.detach()), "tokens": n_pref}
        if note.dispreferred_mask.any():   # a generation that stopped at once has no response row to score
            srkl_sum, n_dis = self._response_term(
                note.dispreferred, note.dispreferred_mask, lambda t, s: dm2.skew_reverse_kl_per_token(t, s, alpha))
            srkl = srkl_sum / n_dis
            total = total + beta * srkl
            log.update({"srkl": float(srkl.detach()), "student_tokens": n_dis})
        log["loss"] = float(total.detach())
        return total, log
