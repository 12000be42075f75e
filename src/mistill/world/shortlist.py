"""RT-003: the retrieved shortlist (App. A, "The retrieved shortlist").

Per note, every inventory code gets two rankings that are fused:

* a supervised head: multi-label logistic regression on the note's
  [max; mean]-pooled chunk embeddings, trained on the train split with the
  patients of both corpora excluded;
* zero-shot similarity: for code c, max over the note's chunks of
  cos(chunk, description(c)) (METHOD-GUIDE §3, recommended reading).

Fusion is reciprocal-rank fusion (recommended reading of "its ranking is
fused"):  score(c) = 1 / (k_rrf + rank_head(c)) + 1 / (k_rrf + rank_zs(c)),
ranks from 1; a code the head never saw as positive has no head rank and is
scored by the zero-shot term alone.  Ties break by the inventory's shared order.

The shortlist is the top K of the fused ranking plus every category sibling of
the top K' (so P2C near-misses stay listed), written in the shared order.  The
pre-registered K rule: the smallest K of the grid whose completed recall (after
adding siblings) reaches the target on both the validation notes and the
distillation corpus.  Recall is "code-level macro recall", read as the mean
over notes of the note's gold recall (METHOD-GUIDE §3).

Encoders share one interface: `fit(texts)` then `encode(texts)` -> L2-normalised
rows.  The demo's is TF-IDF; the paper's is a frozen gte-large, loaded by id
only when used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from mistill.errors import UserError
from mistill.world.inventory import Inventory
from mistill.world.types import Note


# -- chunks and encoders
def chunk_words(text: str, size: int, stride: int) -> list[str]:
    """Overlapping windows of `size` whitespace words every `stride` words; the last window reaches the end."""
    if size < 1 or stride < 1:
        raise UserError(f"shortlist: chunk size and stride must be positive, got {size}, {stride}")
    words = text.split()
    if len(words) <= size:
        return [" ".join(words)]
    starts = list(range(0, len(words) - size + 1, stride))
    if starts[-1] + size < len(words):
        starts.append(len(words) - size)
    return [" ".join(words[s:s + size]) for s in starts]


class Encoder(Protocol):
    def fit(self, texts: Sequence[str]) -> None: ...

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def _l2(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms == 0, 1.0, norms)


class TfidfEncoder:
    """Demo encoder: TF-IDF (unigrams and bigrams, sublinear tf) fitted on training chunks and descriptions.

    The vocabulary is capped at the `max_features` most frequent terms, which
    keeps the head's [max; mean] features small enough to fit in seconds.  The
    cap is chosen here, by (total count desc, term asc): scikit-learn's own cap
    orders tied counts with an unstable argsort whose order depends on the CPU's
    SIMD sort, so two machines would keep different vocabularies.
    """

    def __init__(self, max_features: int | None = 1500) -> None:
        self.max_features = max_features
        self.vectorizer = None

    def fit(self, texts: Sequence[str]) -> None:
        from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer

        counter = CountVectorizer(ngram_range=(1, 2))
        counts = np.asarray(counter.fit_transform(texts).sum(axis=0)).ravel()
        terms = counter.get_feature_names_out()
        keep = np.lexsort((terms, -counts))[:self.max_features]   # lexsort is stable: ties by term
        self.vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, vocabulary=sorted(terms[keep]))
        self.vectorizer.fit(texts)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if self.vectorizer is None:
            raise UserError("shortlist: the TF-IDF encoder is not fitted")
        return _l2(self.vectorizer.transform(texts).toarray().astype(np.float64))


class TransformerEncoder:
    """A frozen sentence encoder by HF id or local dir (the paper's `thenlper/gte-large`): mean-pooled last layer."""

    def __init__(self, model_id: str, *, max_length: int = 512, batch_size: int = 16) -> None:
        self.model_id, self.max_length, self.batch_size = model_id, max_length, batch_size
        self._model = self._tokenizer = None

    def _load(self) -> None:
        from transformers import AutoModel, AutoTokenizer

        try:
            self._tokenizer = AutoTokenizer.from_pretrained(self.model_id)
            self._model = AutoModel.from_pretrained(self.model_id).eval()
        except OSError as err:
            raise UserError(f"shortlist encoder {self.model_id!r}: cannot load ({err})") from None

    def fit(self, texts: Sequence[str]) -> None:
        """Frozen: nothing to fit."""

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        if self._model is None:
            self._load()
        rows = []
        with torch.no_grad():
            for start in range(0, len(texts), self.batch_size):
                batch = self._tokenizer(list(texts[start:start + self.batch_size]), padding=True,
                                        truncation=True, max_length=self.max_length, return_tensors="pt")
                hidden = self._model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                rows.append(((hidden * mask).sum(1) / mask.sum(1).clamp(min=1)).float().numpy())
        return _l2(np.concatenate(rows).astype(np.float64))


def make_encoder(name: str, *, tfidf_max_features: int | None = 1500) -> Encoder:
    return TfidfEncoder(tfidf_max_features) if name == "tfidf" else TransformerEncoder(name)


# -- the retriever
@dataclass(frozen=True)
class RetrieverConfig:
    encoder: str = "tfidf"
    chunk_words: int = 64
    chunk_stride: int = 48
    rrf_k: int = 60
    lr_c: float = 4.0
    tfidf_max_features: int | None = 1500

    @classmethod
    def from_params(cls, params: dict) -> RetrieverConfig:
        return cls(str(params["encoder"]), int(params["chunk_words"]), int(params["chunk_stride"]),
                   int(params["rrf_k"]), float(params["lr_c"]), params.get("tfidf_max_features"))


# Scores are rounded to this many decimals before ranking: BLAS kernels differ between CPUs in
# summation order, so mathematically tied scores (sibling codes with one description vector)
# differ in their last bits from machine to machine; rounded, they tie exactly and the shared
# order breaks the tie.
SCORE_DECIMALS = 9


def _ranks(scores: np.ndarray) -> np.ndarray:
    """Rank 1 = best; scores rounded to SCORE_DECIMALS, ties by index (the shared order)."""
    rounded = np.round(np.asarray(scores, dtype=np.float64), SCORE_DECIMALS)
    order = np.lexsort((np.arange(len(rounded)), -rounded))
    ranks = np.empty(len(rounded), dtype=np.int64)
    ranks[order] = np.arange(1, len(rounded) + 1)
    return ranks


class Retriever:
    def __init__(self, inventory: Inventory, config: RetrieverConfig, encoder: Encoder | None = None):
        self.inventory = inventory
        self.config = config
        self.encoder = encoder or make_encoder(config.encoder, tfidf_max_features=config.tfidf_max_features)
        self.head: tuple[np.ndarray, np.ndarray] | None = None   # (weights [codes, features], intercepts)
        self.trained_codes = np.zeros(len(inventory), dtype=bool)
        self._code_vectors: np.ndarray | None = None

    def _chunks(self, note: Note) -> list[str]:
        return chunk_words(note.text, self.config.chunk_words, self.config.chunk_stride)

    def _pooled(self, chunk_vectors: np.ndarray) -> np.ndarray:
        """[max; mean] pooling over a note's chunk embeddings."""
        return np.concatenate([chunk_vectors.max(axis=0), chunk_vectors.mean(axis=0)])

    def fit(self, train_notes: Sequence[Note]) -> Retriever:
        """Fit the encoder (if it learns) and the multi-label logistic-regression head."""
        from sklearn.linear_model import LogisticRegression

        if not train_notes:
            raise UserError("shortlist: no training notes for the retriever head")
        descriptions = [c.description for c in self.inventory]
        chunks = [self._chunks(n) for n in train_notes]
        self.encoder.fit([c for note_chunks in chunks for c in note_chunks] + descriptions)
        self._code_vectors = self.encoder.encode(descriptions)
        features = np.stack([self._pooled(self.encoder.encode(c)) for c in chunks])
        labels = np.zeros((len(train_notes), len(self.inventory)), dtype=np.int8)
        for row, note in enumerate(train_notes):
            for code in note.gold_codes:
                if code in self.inventory:
                    labels[row, self.inventory.position(code)] = 1
        # A code that is always or never positive in training cannot be fitted: zero-shot only.
        positives = labels.sum(axis=0)
        self.trained_codes = (positives > 0) & (positives < len(train_notes))
        weights = np.zeros((len(self.inventory), features.shape[1]))
        intercepts = np.zeros(len(self.inventory))
        for column in np.flatnonzero(self.trained_codes):
            # one binary L2 logistic regression per code; liblinear's dual solver suits n_notes << n_features
            model = LogisticRegression(C=self.config.lr_c, solver="liblinear", dual=True, max_iter=2000,
                                       random_state=0)   # liblinear shuffles: seeded, not the global RNG
            model.fit(features, labels[:, column])
            weights[column], intercepts[column] = model.coef_[0], model.intercept_[0]
        self.head = (weights, intercepts)
        return self

    def scores(self, note: Note) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(fused RRF score, head probability (nan where untrained), zero-shot similarity) per inventory code."""
        if self.head is None:
            raise UserError("shortlist: the retriever is not fitted")
        chunk_vectors = self.encoder.encode(self._chunks(note))
        zero_shot = (chunk_vectors @ self._code_vectors.T).max(axis=0)
        weights, intercepts = self.head
        logits = weights @ self._pooled(chunk_vectors) + intercepts
        head = np.where(self.trained_codes, 1.0 / (1.0 + np.exp(-logits)), np.nan)
        k = self.config.rrf_k
        fused = 1.0 / (k + _ranks(zero_shot))
        trained = self.trained_codes
        if trained.any():
            head_ranks = np.zeros(len(head), dtype=np.int64)
            head_ranks[trained] = _ranks(logits[trained])   # logits: the probability saturates at 1.0
            fused = fused + np.where(trained, 1.0 / (k + head_ranks), 0.0)
        return fused, head, zero_shot

    def ranking(self, note: Note) -> list[str]:
        """Every inventory code, best first."""
        fused, _, _ = self.scores(note)
        codes = self.inventory.codes
        return [codes[i] for i in np.argsort(_ranks(fused))]


# -- shortlists and the K rule
def build_shortlist(ranking: Sequence[str], inventory: Inventory, *, k: int, sibling_top: int) -> list[str]:
    """Top-k plus every category sibling of the top-`sibling_top`, in the inventory's shared order."""
    kept = set(ranking[:k])
    for code in ranking[:sibling_top]:
        kept.update(inventory.siblings(code))
    return [c for c in inventory.codes if c in kept]


def note_recall(gold: Sequence[str], shortlist: Sequence[str]) -> float | None:
    """Share of a note's gold codes in its shortlist; None for a note without gold codes."""
    return sum(c in set(shortlist) for c in gold) / len(gold) if gold else None


def macro_recall(notes: Sequence[Note], shortlists: dict[str, list[str]]) -> float:
    """Mean over notes (with gold codes) of per-note recall."""
    values = [r for n in notes if (r := note_recall(n.gold_codes, shortlists[n.note_id])) is not None]
    return float(np.mean(values)) if values else float("nan")


def recall_sweep(groups: dict[str, Sequence[Note]], rankings: dict[str, list[str]], inventory: Inventory,
                 *, k_grid: Sequence[int], sibling_top: int) -> list[dict]:
    """Per K: recall without completion (top-K only) and completed (with siblings), for each note group."""
    rows = []
    for k in sorted(k_grid):
        row: dict = {"k": k}
        for name, notes in groups.items():
            plain = {n.note_id: list(rankings[n.note_id][:k]) for n in notes}
            completed = {n.note_id: build_shortlist(rankings[n.note_id], inventory, k=k, sibling_top=sibling_top)
                         for n in notes}
            row[name] = {"recall": macro_recall(notes, plain), "completed_recall": macro_recall(notes, completed),
                         "median_length": float(np.median([len(v) for v in completed.values()]))}
        rows.append(row)
    return rows


def choose_k(sweep: Sequence[dict], *, target: float, groups: Sequence[str]) -> tuple[int, bool]:
    """The pre-registered rule: smallest K whose completed recall reaches `target` on every group.

    Returns (K, reached); when no K reaches it, the largest K of the grid and False.
    """
    for row in sorted(sweep, key=lambda r: r["k"]):
        if all(row[g]["completed_recall"] >= target for g in groups):
            return row["k"], True
    return max(r["k"] for r in sweep), False


def retriever_training_notes(notes: Sequence[Note], *, split: str, exclude_patients: set[str]) -> list[Note]:
    """App. A: the train split with the patients of both corpora excluded."""
    return [n for n in notes if n.split == split and n.patient_id not in exclude_patients]
