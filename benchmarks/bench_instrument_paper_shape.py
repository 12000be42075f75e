"""The teacher's instrument pass at the paper's shape: seconds per note and peak GPU memory (App. C "Compute").

A randomly initialised model of Qwen3-14B's architecture (its public config.json, written out
below), built as `load_model` builds the teacher: config read by `AutoConfig`, static YaRN x4
merged by `apply_rope_scaling`, dtype given at construction (`from_config(dtype=...)`, the
in-memory twin of `from_pretrained(dtype=...)`; never `model.to(bf16)`, which would round RoPE's
fp32 `inv_freq`).  Synthetic notes of random token ids carry events placed at chosen positions
with chosen targets and competitors (the real extraction needs a real trace; only its CPU step is
replaced); everything else is the project's own pass code, run as `mistill instrument` runs it:

    events (teacher-forced margins)  passes.run_events     (extract_events swapped for the placed events)
    attribution + exact patches      passes.run_attribution (prefill, first-order, nominee patches)
    calibration                      passes.run_calibration (I_c, BH tests, global sets; CPU)
    necessity + knock-in             passes.run_knockin     (clean and donor prefills, set batches,
                                                             exact P2C refinement)

Per note: the paper's mean event counts over its 100 traces (App. C, Table 6 / R-C1: 2,064 P1,
7,688 P2, 3,855 P2C) and params' n_null NULL events; settings from params.yaml's paper profile
(nominees_topk 40, global top 16, max_batch 128, bins 3..100, sdpa, bf16, YaRN x4).

Also checks that the fast patch paths equal the slow one on this model: exact_importance (cached,
batched: what the attribution pass runs) and a cached single-token patch against
`brute_force_logits` (a full forward with the head replaced), at a shorter context.

    python benchmarks/bench_instrument_paper_shape.py                # CPU: --tiny (seconds)
    python benchmarks/bench_instrument_paper_shape.py --paper --long-tokens 110000 \\
        --out benchmarks/results/instrument_paper_shape_h200.json    # one H200: ~4 min
    python benchmarks/bench_instrument_paper_shape.py --paper --only-exactness --exactness-fp32
                                            # the check again, then with the same weights in fp32 (~1.5 min)

`--teacher teacher_qwq` builds QwQ-32B's shape instead (R-C15's second teacher: Qwen2, 64 layers, 32.8B
parameters) under its own YaRN setting from params:

    python benchmarks/bench_instrument_paper_shape.py --paper --teacher teacher_qwq --long-tokens 110000 \\
        --out benchmarks/results/instrument_paper_shape_qwq32b_h200.json

--long-tokens adds one note of the paper's length (~110k tokens) through events and attribution,
the pass the paper's 176 s per note measures.  benchmarks/results/instrument_paper_shape_h200.json
holds both H200 runs (its "runs" key).

Without CUDA the script runs --tiny (a 4-layer model, notes of a few hundred tokens) so that
`nox -s bench` exercises every path on CPU; --paper without CUDA prints "skipped" and exits 0.
Needs torch, transformers, numpy, scipy, statsmodels, pyyaml, tqdm; mistill from src/.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

PAPER_ATTRIBUTION_S_PER_NOTE = 176.0  # App. C "Compute": median, RTX Pro 6000 lanes, ~110k-token notes
PAPER_FAITHFULNESS_FORWARDS_PER_NOTE = 7000  # App. C "Compute": single-token forwards per note
PAPER_MS_PER_FORWARD_110K_H200 = 72.0
PAPER_EVENTS_PER_NOTE = {"P1": 21, "P2": 77, "P2C": 39}  # 2,064 / 7,688 / 3,855 over 100 traces (R-C1)
BF16_TOLERANCE_NATS = 0.1  # tests/instrument/test_hook_patching.py: bf16 path against fp32, "bf16 rounding only"

# config.json of Qwen/Qwen3-14B (public release), written out by hand
QWEN3_14B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 17408,
    "max_position_embeddings": 40960, "max_window_layers": 40, "model_type": "qwen3",
    "num_attention_heads": 40, "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
# config.json of Qwen/QwQ-32B (public release; R-C15's second teacher, App. H), written out by hand: Qwen2,
# biased q/k/v, 64 layers of 40 heads, YaRN x4 over a 32,768-token base from params (models.rope_scaling)
QWQ_32B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
    "intermediate_size": 27648, "max_position_embeddings": 40960, "max_window_layers": 64, "model_type": "qwen2",
    "num_attention_heads": 40, "num_hidden_layers": 64, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 152064,
}
SHAPES = {"teacher": ("Qwen3-14B", QWEN3_14B), "teacher_qwq": ("QwQ-32B", QWQ_32B)}
# the same architecture, tiny: a CPU smoke test of every path
TINY = {**QWEN3_14B, "head_dim": 16, "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 256,
        "max_window_layers": 4, "num_attention_heads": 4, "num_hidden_layers": 4, "num_key_value_heads": 2,
        "vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2}
TINY_EVENTS = {"P1": 3, "P2": 8, "P2C": 4}

# the paper profile's instrument settings as params.yaml held them when this was written (used only if
# params.yaml cannot be read: another engineer may be editing it)
FALLBACK_PAPER = {
    "models": {"teacher": "Qwen/Qwen3-14B", "dtype": "bfloat16", "attn_implementation": "eager",
               "rope_scaling": {"teacher": {"rope_type": "yarn", "factor": 4.0,
                                            "original_max_position_embeddings": 40960}}},
    "instrument": {"seed": 0,
                   "events": {"n_null": 20, "null_min_distance": 8, "p2c_cap": 2, "unknown_codes": "ignore"},
                   "attribution": {"hook": "detached", "attn_implementation": "sdpa", "nominees_topk": 40,
                                   "nominees_global_topk": 16, "null_exact_share": 0.5, "max_batch": 128},
                   "calibration": {"fdr": 0.05, "pool_k": 40, "summary_top_k": 16, "recurrence_top_k": 20},
                   "knockin": {"bins": [3, 8, 16, 40, 100], "min_range": 1.0, "donor_match": "first"}},
}


# ---- inputs ----------------------------------------------------------------------------------------


class IdTokenizer:
    """Text is the token ids written out ("17 4 2093 ..."): model_input() then yields the note's ids."""

    name = "ids"
    eos_token_id = pad_token_id = 0

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def chat_prompt(self, user_text: str, *, thinking: bool = True) -> str:
        return user_text

    def encode(self, text: str):
        from mistill.models.tokenizer_protocol import Encoding

        ids, offsets, at = [], [], 0
        for piece in text.split(" "):
            ids.append(int(piece))
            offsets.append((at, at + len(piece)))
            at += len(piece) + 1
        return Encoding(ids, offsets)

    def decode(self, ids):
        return " ".join(str(i) for i in ids)


def synthetic_note(note_id: str, n_tokens: int, trace_tokens: int, counts: dict[str, int], n_null: int,
                   vocab: int, seed: int):
    """Random ids with code mentions placed in the trace (the last `trace_tokens` tokens).

    A code mention is a chapter letter (P1) followed by its characters (P2, the separator skipped);
    P2C events sit at the divergence character of later sibling mentions; NULL events at prose
    positions away from any mention.  The decided token is written at each event's position, so
    the input is teacher-forced as a real trace is.
    """
    from mistill.instrument.events import Event

    rng = np.random.default_rng(seed)
    ids = rng.integers(10, vocab, size=n_tokens)
    # 25 letter tokens (the inventory's letters) and 36 character tokens, fixed across notes
    table = np.random.default_rng(12345).choice(np.arange(10, vocab), size=61, replace=False)
    letters, chars = table[:25].tolist(), table[25:].tolist()
    slot = 8  # one mention (or NULL position) per 8-token slot: NULLs stay >= null_min_distance apart
    n_slots = trace_tokens // slot
    p2_per_mention = np.full(counts["P1"], counts["P2"] // max(counts["P1"], 1))
    p2_per_mention[: counts["P2"] - int(p2_per_mention.sum())] += 1
    need = counts["P1"] + counts["P2C"] + n_null
    if need > n_slots or p2_per_mention.max(initial=0) > slot - 2:
        raise SystemExit(f"trace of {trace_tokens} tokens too short for {need} mentions")
    slots = rng.permutation(n_slots)[:need]
    start = n_tokens - trace_tokens
    events = []
    kinds = ["P1"] * counts["P1"] + ["P2C"] * counts["P2C"] + ["NULL"] * n_null
    for m, (kind, s) in enumerate(zip(kinds, slots)):
        base = start + int(s) * slot
        if kind == "P1":
            letter = int(rng.integers(25))
            events.append(Event("P1", base, letters[letter], [x for i, x in enumerate(letters) if i != letter], 0))
            offsets = [1, 2, 4, 5, 6, 3][: int(p2_per_mention[m])]  # characters after the letter, "." at +3
            for off in offsets:
                c = rng.choice(36, size=1 + int(rng.integers(1, 9)), replace=False)
                events.append(Event("P2", base + off, chars[c[0]], [chars[i] for i in c[1:]], 0))
        elif kind == "P2C":
            c = rng.choice(36, size=2, replace=False)
            events.append(Event("P2C", base + 1 + int(rng.integers(5)), chars[c[0]], [chars[c[1]]], 0))
        else:
            letter = int(rng.integers(25))
            events.append(Event("NULL", base + 4, letters[letter],
                                [x for i, x in enumerate(letters) if i != letter], 0))
    events.sort(key=lambda e: e.pos)
    for e in events:
        if e.kind != "NULL":
            ids[e.pos] = e.target_id
    return {"note_id": note_id, "prompt": " ".join(str(int(i)) for i in ids), "completion": ""}, events


# ---- the model, as load_model builds the teacher ----------------------------------------------------


def build_teacher(config_json: dict, cfg, workdir: Path, device: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    from mistill.models.loading import apply_rope_scaling, rope_buffers

    directory = workdir / "teacher"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config_json, indent=2))
    config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    apply_rope_scaling(config, cfg.rope_scaling)
    dtype = getattr(torch, cfg.dtype)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=cfg.attn_implementation)
    model.eval().requires_grad_(False)
    if device == "cuda":
        torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    rope = rope_buffers(model)
    rotary = model.model.rotary_emb
    inv = rotary.inv_freq
    # what `model.to(bf16)` would have done to the angles at the longest position used
    rounded = inv.to(torch.bfloat16).float()
    info = {
        "build_seconds": build_s,
        "parameters": sum(p.numel() for p in model.parameters()),
        "parameter_dtypes": sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()}),
        "rope_parameters": dict(model.config.rope_parameters or {}),
        "max_position_embeddings": model.config.max_position_embeddings,
        "attn_implementation": model.config._attn_implementation,
        "rope_buffers": {name: str(buf.dtype).removeprefix("torch.") for name, buf in rope.items()},
        "rope_attention_scaling": float(getattr(rotary, "attention_scaling", float("nan"))),
        "inv_freq_fp32": inv.dtype == torch.float32,
        "_inv_freq_rounding_error": (inv.float() - rounded).abs(),
    }
    return model, info


# ---- timing -----------------------------------------------------------------------------------------


class Clock:
    """Wall seconds of wrapped functions (synchronised), and forward counts of the model."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.rows: dict[str, list[float]] = defaultdict(list)
        self.forwards: dict[str, int] = defaultdict(int)
        self.stage = "setup"
        self._restore = []

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def wrap(self, module, name: str, label: str, before=None):
        fn = getattr(module, name)

        def wrapped(*args, **kwargs):
            if before is not None:
                before()
            self.sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.sync()
            self.rows[label].append(time.perf_counter() - t0)
            return out

        setattr(module, name, wrapped)
        self._restore.append((module, name, fn))

    def restore(self):
        for module, name, fn in reversed(self._restore):
            setattr(module, name, fn)
        self._restore = []

    def count_forwards(self, model):
        def pre(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            cache = kwargs.get("past_key_values")
            n = int(ids.shape[-1])
            if cache is not None and cache.get_seq_length() > 0:  # against a cache: n variants of one token
                self.forwards[f"{self.stage}:cached_forwards"] += 1
                self.forwards[f"{self.stage}:cached_tokens"] += n
            else:
                self.forwards[f"{self.stage}:full_forwards"] += 1
                self.forwards[f"{self.stage}:full_tokens"] += n

        return model.register_forward_pre_hook(pre, with_kwargs=True)

    def summary(self, prefix: str = "") -> dict:
        return {k: {"calls": len(v), "seconds": sum(v), "ms_per_call": 1e3 * sum(v) / len(v)}
                for k, v in sorted(self.rows.items()) if k.startswith(prefix)}


def peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


def reset_peak(device: str):
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


# ---- the exactness check ----------------------------------------------------------------------------


def exactness(model, n_tokens: int, vocab: int, max_batch: int, device: str) -> dict:
    """Fast patch paths against the slow one on this model: margins per (event, head), max |diff|."""
    from mistill.instrument.attribution import Decision, exact_importance
    from mistill.instrument.hook import HeadHook, Replacement
    from mistill.instrument.margin import margin
    from mistill.instrument.patching import brute_force_logits, forward_variants, prefill

    hook = HeadHook(model)
    L, H = hook.n_layers, hook.n_heads
    rng = np.random.default_rng(7)
    ids = rng.integers(10, vocab, size=n_tokens).tolist()
    heads = sorted({(0, 0), (1, H // 2), (L // 4, 1), (L // 2, 2), (3 * L // 4, 3), (L - 2, 5 % H), (L - 1, 4 % H),
                    (L - 1, H - 1)})
    letters = rng.choice(np.arange(10, vocab), size=25, replace=False).tolist()
    rows, t0 = [], time.perf_counter()
    try:
        pre = prefill(model, hook, ids, reserve=max_batch)
        for q in (n_tokens - 1, (3 * n_tokens) // 4, n_tokens // 2):  # decreasing: the cache only crops
            target, competitors = letters[0], letters[1:]
            with torch.no_grad():
                clean_fast, effects_batched = exact_importance(model, hook, pre.cache,
                                                               Decision(q, ids[q], target, competitors), pre.mu, heads,
                                                               max_batch)
                brute_clean_logits = brute_force_logits(model, hook, ids[:q], ids[q], None, None)
                clean_slow = float(margin(brute_clean_logits, target, competitors))
                single_clean = float(margin(forward_variants(model, hook, pre.cache, q, ids[q], None, 1)[0],
                                            target, competitors))
                row = {"q": q, "clean_margin_slow": clean_slow, "clean_diff_batched": clean_fast - clean_slow,
                       "clean_diff_single": single_clean - clean_slow,
                       "max_abs_logit": float(brute_clean_logits.abs().max()), "heads": []}
                for (layer, head), eff_b in zip(heads, effects_batched):
                    mask = torch.zeros(L, H, dtype=torch.bool)
                    mask[layer, head] = True
                    slow = float(margin(brute_force_logits(model, hook, ids[:q], ids[q], mask, pre.mu),
                                        target, competitors))
                    single = float(margin(forward_variants(model, hook, pre.cache, q, ids[q],
                                                           Replacement(mask[:, None], pre.mu), 1)[0],
                                          target, competitors))
                    row["heads"].append({"layer": layer, "head": head, "effect_slow": clean_slow - slow,
                                         "effect_batched": float(eff_b), "ablated_diff_single": single - slow,
                                         "effect_diff_batched": float(eff_b) - (clean_slow - slow)})
                everything = torch.ones(L, H, dtype=torch.bool)  # every head at once: a large effect
                slow = float(margin(brute_force_logits(model, hook, ids[:q], ids[q], everything, pre.mu),
                                    target, competitors))
                single = float(margin(forward_variants(model, hook, pre.cache, q, ids[q],
                                                       Replacement(everything[:, None], pre.mu), 1)[0],
                                      target, competitors))
                row["all_heads"] = {"effect_slow": clean_slow - slow, "ablated_diff_single": single - slow}
            rows.append(row)
        del pre
    finally:
        hook.remove()
    diffs_single = [abs(r["clean_diff_single"]) for r in rows] + \
        [abs(h["ablated_diff_single"]) for r in rows for h in r["heads"]] + \
        [abs(r["all_heads"]["ablated_diff_single"]) for r in rows]
    diffs_batched = [abs(r["clean_diff_batched"]) for r in rows] + \
        [abs(h["effect_diff_batched"]) for r in rows for h in r["heads"]]
    effects = [abs(h["effect_slow"]) for r in rows for h in r["heads"]]
    top_logit = max(r["max_abs_logit"] for r in rows)
    ulp = 2.0 ** (math.floor(math.log2(top_logit)) - 7) if top_logit > 0 else float("nan")
    tol = BF16_TOLERANCE_NATS if next(model.parameters()).dtype == torch.bfloat16 else 1e-4
    worst = max(diffs_single + diffs_batched)
    return {"context_tokens": n_tokens, "events": len(rows), "heads_per_event": len(heads), "heads": heads,
            "seconds": time.perf_counter() - t0,
            "max_abs_margin_diff_single_cached_vs_full_forward": max(diffs_single),
            "max_abs_effect_diff_batched_cached_vs_full_forward": max(diffs_batched),
            "median_abs_single_head_effect": float(np.median(effects)),
            "max_abs_single_head_effect": float(np.max(effects)),
            "all_heads_effect_slow": [r["all_heads"]["effect_slow"] for r in rows],
            "max_abs_logit": top_logit, "logit_ulp_at_that_scale": ulp,
            "worst_diff_in_ulps": worst / ulp if ulp == ulp else None,
            "tolerance_nats": tol, "passed": worst <= tol, "rows": rows}


def precision_gap(low: list[dict], fp32: list[dict]) -> dict:
    """How far the bf16 numbers (slow and fast) lie from the fp32 slow path on the same weights."""
    slow, batched, single, clean = [], [], [], []
    for rl, rf in zip(low, fp32):
        clean.append(abs(rl["clean_margin_slow"] - rf["clean_margin_slow"]))
        for hl, hf in zip(rl["heads"], rf["heads"]):
            slow.append(abs(hl["effect_slow"] - hf["effect_slow"]))
            batched.append(abs(hl["effect_batched"] - hf["effect_slow"]))
            ablated_low_single = rl["clean_margin_slow"] - hl["effect_slow"] + hl["ablated_diff_single"]
            single.append(abs(ablated_low_single - (rf["clean_margin_slow"] - hf["effect_slow"])))
    return {"max_abs_clean_margin_slow_low_vs_fp32": max(clean),
            "max_abs_effect_slow_low_vs_fp32_slow": max(slow),
            "max_abs_effect_batched_low_vs_fp32_slow": max(batched),
            "max_abs_ablated_margin_single_low_vs_fp32_slow": max(single)}


# ---- the passes -------------------------------------------------------------------------------------


def load_paper_params() -> tuple[dict, str]:
    try:
        from mistill.params import load_params

        return load_params(ROOT / "params.yaml", profile="paper"), "params.yaml (paper profile)"
    except Exception as err:  # noqa: BLE001 - a half-edited params.yaml must not stop a paid GPU run
        print(f"params.yaml unreadable ({err}); using the settings recorded in this script", file=sys.stderr)
        return copy.deepcopy(FALLBACK_PAPER), "built-in copy of the paper profile"


def per_note_attr_stats(out: Path, note_ids: list[str]) -> dict:
    from mistill.instrument.passes import load_attr

    exact_per = defaultdict(list)
    for note in note_ids:
        path = out / note / "attr.npz"
        if not path.exists():
            continue
        arrays = load_attr(path)
        for kind, row in zip(arrays["kinds"], arrays["exact"]):
            exact_per[str(kind)].append(int((~np.isnan(row)).sum()))
    return {k: {"events": len(v), "mean_exact_patches": float(np.mean(v))} for k, v in exact_per.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--tiny", action="store_true", help="a tiny Qwen3 on CPU (default without CUDA)")
    mode.add_argument("--paper", action="store_true",
                      help="the paper's shape on CUDA (default with CUDA): Qwen3-14B, or QwQ-32B with --teacher")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda with --paper, cpu with --tiny")
    ap.add_argument("--notes", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=None, help="tokens per note (paper 30000, tiny 400)")
    ap.add_argument("--trace-tokens", type=int, default=None, help="the trace at the note's end (4000 / 200)")
    ap.add_argument("--exact-tokens", type=int, default=None, help="context of the exactness check (4096 / 160)")
    ap.add_argument("--long-tokens", type=int, default=0,
                    help="then one more note of this many tokens through events + attribution (e.g. 110000)")
    ap.add_argument("--skip-exactness", action="store_true")
    ap.add_argument("--exactness-fp32", action="store_true",
                    help="repeat the exactness check with the same weights in fp32 (cast_weights; inv_freq kept)")
    ap.add_argument("--only-exactness", action="store_true", help="stop after the exactness check")
    ap.add_argument("--out", default=None, help="write the JSON summary here too")
    ap.add_argument("--workdir", default=None, help="artifacts of the passes (default: a temporary directory)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                    help="default: the profile's (bfloat16); float32 for --tiny on CPU")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--teacher", choices=sorted(SHAPES), default="teacher",
                    help="whose shape with --paper: the teacher (Qwen3-14B) or the second teacher (QwQ-32B, R-C15)")
    args = ap.parse_args(argv)

    has_cuda = torch.cuda.is_available()
    if args.paper and not has_cuda:
        print("skipped: no CUDA device (--paper builds a 14.8B-parameter model; use --tiny on CPU)")
        return 0
    tiny = args.tiny or not has_cuda
    device = args.device or ("cpu" if tiny else "cuda")
    if device == "cuda" and not has_cuda:
        print("skipped: no CUDA device")
        return 0
    torch.set_num_threads(args.threads)
    n_tokens = args.tokens or (400 if tiny else 30000)
    trace_tokens = args.trace_tokens or (200 if tiny else 4000)
    exact_tokens = args.exact_tokens or (160 if tiny else 4096)

    from mistill.instrument import passes
    from mistill.instrument.events import ExtractionReport
    from mistill.instrument.passes import InstrumentConfig

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="mistill-bench-instrument-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    params, params_source = load_paper_params()
    params = copy.deepcopy(params)
    section = params.setdefault("instrument", {})
    section.update(traces=str(workdir / "traces.jsonl"), inventory=str(workdir / "inventory.jsonl"),
                   out_dir=str(workdir / "HD"))
    models = params.setdefault("models", {})
    # the teacher is not a directory of weights: config_sha256 hashes the name
    shape_name, paper_config = SHAPES[args.teacher]
    models["teacher"] = f"random-init:{shape_name}-shape" if not tiny else "random-init:tiny-qwen3"
    if tiny:  # YaRN x4 over the tiny model's own window, as the teacher's over 40,960
        models["rope_scaling"] = {"teacher": {"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": TINY["max_position_embeddings"]}}
    cfg = InstrumentConfig.from_params(params)
    if not tiny and args.teacher != "teacher":   # its own YaRN setting from params, as `--teacher` runs it
        cfg.rope_scaling = (models.get("rope_scaling") or {}).get(args.teacher)
    if args.dtype:
        cfg.dtype = args.dtype
    elif tiny and device == "cpu":
        cfg.dtype = "float32"  # CPU: bf16 matmuls are slow and this is a smoke test of the paths
    config_json = TINY if tiny else paper_config
    counts = TINY_EVENTS if tiny else PAPER_EVENTS_PER_NOTE
    n_null = min(cfg.n_null, 6) if tiny else cfg.n_null

    code_version = os.environ.get("MISTILL_CODE_VERSION")
    if not code_version:
        try:
            code_version = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                          text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            code_version = "unknown"
    # the passes record `git status` in every artifact's provenance: run them outside the checkout
    os.chdir(workdir)

    result: dict = {
        "benchmark": "bench_instrument_paper_shape", "argv": sys.argv[1:] if argv is None else list(argv),
        "mode": "tiny" if tiny else "paper", "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__, "code_version": code_version, "params_source": params_source,
        "instrument_config": {k: v for k, v in cfg.as_dict().items() if k not in ("traces", "inventory", "out_dir")},
        "notes": args.notes, "tokens_per_note": n_tokens, "trace_tokens": trace_tokens,
        "events_per_note": {**counts, "NULL": n_null},
        "paper": {"attribution_s_per_note_median": PAPER_ATTRIBUTION_S_PER_NOTE,
                  "attribution_hardware": "RTX Pro 6000 (7 lanes), notes of ~106k prompt + trace tokens",
                  "faithfulness_single_token_forwards_per_note": PAPER_FAITHFULNESS_FORWARDS_PER_NOTE,
                  "ms_per_single_token_forward_110k_h200": PAPER_MS_PER_FORWARD_110K_H200},
    }
    import transformers

    result["transformers"] = transformers.__version__

    def save():
        text = json.dumps(result, indent=2, default=str)
        if args.out:
            out_path = Path(args.out)
            if not out_path.is_absolute():
                out_path = ROOT / out_path
            out_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = out_path.with_suffix(".tmp")
            tmp.write_text(text + "\n")
            tmp.replace(out_path)
        return text

    model, info = build_teacher(config_json, cfg, workdir, device)
    rounding = info.pop("_inv_freq_rounding_error")
    for span in (n_tokens, args.long_tokens):
        if span:
            info[f"bf16_rounded_inv_freq_max_angle_error_rad_at_{span}"] = float(rounding.max() * span)
    result["model"] = info
    result["model_memory_gib"] = peak_gib(device)
    print(json.dumps({"model": info}, default=str), file=sys.stderr, flush=True)
    vocab = config_json["vocab_size"]

    if not args.skip_exactness:
        reset_peak(device)
        result["exactness"] = exactness(model, exact_tokens, vocab, cfg.max_batch, device)
        result["exactness"]["peak_gib"] = peak_gib(device)
        print(json.dumps({k: v for k, v in result["exactness"].items() if k != "rows"}), file=sys.stderr,
              flush=True)
        save()
        if args.exactness_fp32 and next(model.parameters()).dtype != torch.float32:
            from mistill.models.loading import cast_weights

            low = next(model.parameters()).dtype
            cast_weights(model, torch.float32)  # the same weights, exactly; RoPE's inv_freq stays fp32
            reset_peak(device)
            fp32 = exactness(model, exact_tokens, vocab, cfg.max_batch, device)
            fp32["peak_gib"] = peak_gib(device)
            from mistill.models.loading import rope_buffers

            fp32["rope_buffers_after_cast"] = {k: str(v.dtype).removeprefix("torch.")
                                               for k, v in rope_buffers(model).items()}
            fp32["against_low_precision"] = precision_gap(result["exactness"]["rows"], fp32["rows"])
            result["exactness_fp32"] = fp32
            cast_weights(model, low)  # back: bf16 -> fp32 -> bf16 is lossless
            print(json.dumps({k: v for k, v in fp32.items() if k != "rows"}), file=sys.stderr, flush=True)
            save()
    if args.only_exactness:
        print(save())
        return 0

    # ---- the notes
    notes, events_by_note = [], {}
    for n in range(args.notes):
        trace, events = synthetic_note(f"synthetic{n:02d}", n_tokens, trace_tokens, counts, n_null, vocab, seed=n)
        notes.append(trace)
        events_by_note[trace["note_id"]] = events
    Path(cfg.traces).write_text("".join(json.dumps(t) + "\n" for t in notes))
    tokenizer = IdTokenizer(vocab)

    clock = Clock(device)
    handle = clock.count_forwards(model)
    from mistill.instrument import attribution as attribution_mod
    from mistill.instrument import knockin as knockin_mod
    from mistill.instrument import patching as patching_mod

    def placed_events(**kwargs):  # the CPU extraction, replaced: the events placed in the synthetic note
        return copy.deepcopy(events_by_note[kwargs["note_id"]]), ExtractionReport()

    passes.extract_events = placed_events
    passes.inventory_codes = lambda path: []
    knockin_prefills = {"n": 0}

    def knockin_phase():
        knockin_prefills["n"] += 1
        clock.stage = "knockin.necessity" if knockin_prefills["n"] % 2 == 1 else "knockin.knockin"

    clock.wrap(patching_mod, "prefill", "attribution.prefill")  # run_attribution imports it at call time
    clock.wrap(attribution_mod, "attribute_note", "attribution.attribute_note")
    clock.wrap(attribution_mod, "first_order_batch", "attribution.first_order (fwd+bwd, batched events)")
    clock.wrap(attribution_mod, "exact_importance_batch", "attribution.exact_patches (batched events)")
    clock.wrap(knockin_mod, "faithfulness_note", "knockin.faithfulness_note")
    clock.wrap(knockin_mod, "prefill", "knockin.prefill (clean, donor)", before=knockin_phase)
    clock.wrap(knockin_mod, "run_variants", "knockin.variants (clean + necessity + P2C exact; knock-in)")

    stages: dict = {}

    def run_stage(name, fn):
        clock.stage = name
        reset_peak(device)
        clock.sync()
        t0 = time.perf_counter()
        value = fn()
        clock.sync()
        seconds = time.perf_counter() - t0
        stages[name] = {"seconds": seconds, "s_per_note": seconds / args.notes, "peak_gib": peak_gib(device)}
        print(json.dumps({name: stages[name]}), file=sys.stderr, flush=True)
        return value

    try:
        events_summary = run_stage("events", lambda: passes.run_events(cfg, params, model=model, tokenizer=tokenizer))
        run_stage("attribution", lambda: passes.run_attribution(cfg, params, model=model, tokenizer=tokenizer))
        calibration = run_stage("calibration", lambda: passes.run_calibration(cfg, params))
        faithfulness = run_stage("knockin", lambda: passes.run_knockin(cfg, params, model=model,
                                                                        tokenizer=tokenizer))
    finally:
        clock.restore()
    note_ids = [t["note_id"] for t in notes]
    attr_notes = clock.rows.get("attribution.attribute_note", [])
    attr_prefills = clock.rows.get("attribution.prefill", [])
    knock_notes = clock.rows.get("knockin.faithfulness_note", [])
    attribution_per_note = [a + p for a, p in zip(attr_notes, attr_prefills)]
    events_s = stages["events"]["seconds"] / args.notes
    per_note_total = [events_s + a + k + stages["calibration"]["seconds"] / args.notes
                      for a, k in zip(attribution_per_note, knock_notes)]
    result["stages"] = stages
    result["breakdown"] = clock.summary()
    result["forwards"] = dict(clock.forwards)
    result["forwards_per_note"] = {k: v / args.notes for k, v in clock.forwards.items()}
    result["per_note"] = {"note_ids": note_ids, "attribution_s (prefill + attribute_note)": attribution_per_note,
                          "knockin_s (faithfulness_note)": knock_notes, "instrument_pass_s": per_note_total}
    result["exact_patches_per_event"] = per_note_attr_stats(Path(cfg.out_dir), note_ids)
    result["events_summary"] = {k: events_summary.get(k) for k in ("notes", "counts", "skipped")}
    result["calibration_summary"] = {k: calibration.get(k) for k in
                                     ("n_notes", "split_half_null_discoveries", "null_raw_bh_positive")}
    result["knockin_invariant_all_heads_minus_clean"] = {
        phase: {k: entry.get(k) for k in ("n_knockin_events", "all_heads_minus_clean_median",
                                          "all_heads_minus_clean_max_abs")}
        for phase, entry in faithfulness.get("phases", {}).items()}
    result["headline"] = {
        "s_per_note_instrument_pass (events+attribution+calibration+knockin), median":
            float(np.median(per_note_total)),
        "s_per_note_attribution_pass, median": float(np.median(attribution_per_note)),
        "paper_attribution_s_per_note": PAPER_ATTRIBUTION_S_PER_NOTE,
        "peak_gib_max_memory_allocated": max((s["peak_gib"] or 0) for s in stages.values()) if device == "cuda"
        else None,
        "exactness_max_abs_diff_nats": (max(result["exactness"]["max_abs_margin_diff_single_cached_vs_full_forward"],
                                            result["exactness"]["max_abs_effect_diff_batched_cached_vs_full_forward"])
                                        if "exactness" in result else None),
        "exactness_tolerance_nats": result.get("exactness", {}).get("tolerance_nats"),
    }
    save()
    print(json.dumps({"headline": result["headline"]}), file=sys.stderr, flush=True)

    # ---- one long note (the paper's ~110k tokens), events + attribution only
    if args.long_tokens:
        trace, events = synthetic_note("synthetic_long", args.long_tokens, trace_tokens, counts, n_null, vocab,
                                       seed=99)
        events_by_note[trace["note_id"]] = events
        with open(cfg.traces, "a") as fh:
            fh.write(json.dumps(trace) + "\n")
        clock.rows.clear()
        for module, name, label in ((patching_mod, "prefill", "long.prefill"),
                                    (attribution_mod, "attribute_note", "long.attribute_note"),
                                    (attribution_mod, "first_order_batch", "long.first_order (fwd+bwd)"),
                                    (attribution_mod, "exact_importance_batch", "long.exact_patches (batched)")):
            clock.wrap(module, name, label)
        long: dict = {"tokens": args.long_tokens}
        try:
            for name, fn in (("events", lambda: passes.run_events(cfg, params, model=model, tokenizer=tokenizer)),
                             ("attribution", lambda: passes.run_attribution(cfg, params, model=model,
                                                                            tokenizer=tokenizer))):
                clock.stage = f"long.{name}"
                reset_peak(device)
                clock.sync()
                t0 = time.perf_counter()
                fn()  # the earlier notes' artifacts are valid: only the new note is computed
                clock.sync()
                long[f"{name}_s"] = time.perf_counter() - t0
                long[f"{name}_peak_gib"] = peak_gib(device)
                print(json.dumps({f"long.{name}": long}), file=sys.stderr, flush=True)
        except torch.OutOfMemoryError as err:
            long["error"] = f"out of memory: {str(err).splitlines()[0]}"
        finally:
            clock.restore()
        long["breakdown"] = clock.summary("long.")
        long["forwards"] = {k: v for k, v in clock.forwards.items() if k.startswith("long.")}
        if "attribution_s" in long:
            long["attribution_s_vs_paper_176"] = long["attribution_s"] / PAPER_ATTRIBUTION_S_PER_NOTE
        result["long_note"] = long
        save()
    handle.remove()
    print(save())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
