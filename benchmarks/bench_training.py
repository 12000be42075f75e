"""One training step of Vanilla CoT-KD and of Mistill, side by side (App. I.5, R-D9).

A randomly initialised model of the student's shape reads one synthetic note of the paper's
length (a ~30k-token shortlist prompt plus a ~6k-token trace), built as real text in App. B's
prompt layout so the real bucket, alignment and pooling code runs.  Both arms use the trainer's
own settings (bf16 weights without an fp32 master copy, sdpa attention, gradient checkpointing,
AdamW, vocabulary logits in chunks); Mistill's pooled attention is recomputed at the supervised
rows only.  Prints one JSON summary: seconds per note (forward + backward of one micro-step),
the optimiser step, and peak GPU memory per arm.

    python benchmarks/bench_training.py --device cuda --shape qwen3-4b --prompt-tokens 30000 --trace-tokens 6000
    python benchmarks/bench_training.py --device cpu --shape tiny --prompt-tokens 600 --trace-tokens 300

Needs only torch and transformers (plus numpy, which torch installs); mistill is imported from
the repository's src/.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np
import torch

from mistill.distill import arms
from mistill.distill import buckets as bk
from mistill.distill.mechanism import note_view, supervised_layers
from mistill.distill.pooled_attention import SupervisedRows
from mistill.distill.pools import Pool, softmax_weights
from mistill.distill.trainer import TrainConfig, make_optimizer, prepare_model
from mistill.models.tokenizer_protocol import Encoding
from mistill.world.prompt import build_prompt

SHAPES = {
    # Qwen3-4B (App. J.1): 36 layers of 32 heads, 8 key-value heads
    "qwen3-4b": {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 2048},
}
LETTERS = [c for c in "ABCDEFGHIJKLMNOPQRSTVWXYZ"]
WORDS = ["chronic", "acute", "disease", "disorder", "unspecified", "without", "with", "complications", "of", "the", "left", "right", "upper", "lower", "stage", "failure", "syndrome", "infection", "neoplasm", "malignant", "benign", "injury", "fracture", "pain", "deficiency", "type", "history", "elevated", "reduced", "bilateral", "primary", "secondary", "mild", "moderate", "severe", "episode", "due", "other"]


class SyntheticTokenizer:
    """A word / digit / punctuation tokenizer with offsets: a code is written letter + one token per
    character, as the teacher's tokenizer writes it (App. C), so events realise as they do on Qwen3."""

    _TOKEN = re.compile(r"<\|[a-z_]+\|>|</?think>|\s?[A-Za-z]+|\s?\d|\s?[^\sA-Za-z\d]|\s+")

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.name = "synthetic"
        self.eos_token_id = self.pad_token_id = 0

    def _id(self, piece: str) -> int:
        return 1 + (int.from_bytes(piece.encode()[:8].ljust(8, b"\0"), "little") * 2654435761 + len(piece)) \
            % (self.vocab_size - 1)

    def encode(self, text: str) -> Encoding:
        spans = [(m.start(), m.end()) for m in self._TOKEN.finditer(text)]
        return Encoding([self._id(text[s:e]) for s, e in spans], spans)

    def decode(self, ids):
        raise NotImplementedError

    def chat_prompt(self, user_text: str, *, thinking: bool = True) -> str:
        return f"<|im_start|>user\n{user_text}<|im_end|>\n<|im_start|>assistant\n"


def synthetic_note(tok: SyntheticTokenizer, prompt_tokens: int, trace_tokens: int, rng: np.random.Generator):
    """A shortlist prompt and a trace of about the requested token counts, with codes, siblings and
    near-miss mentions, and its P1 / P2 / P2C events (App. C definitions)."""
    lines, codes = [], []
    n_tok = 0
    while n_tok < prompt_tokens * 0.8:
        cat = f"{rng.choice(LETTERS)}{rng.integers(10, 99)}"
        for sub in range(int(rng.integers(1, 4))):
            code = f"{cat}.{sub}"
            if code in codes:
                continue
            line = f"{code} " + " ".join(rng.choice(WORDS, 14))
            codes.append(code)
            lines.append(line)
            n_tok += len(tok.encode(line).ids) + 1
    note_words = max(10, int(prompt_tokens * 0.18))
    note = " ".join(rng.choice(WORDS, note_words))
    prompt = build_prompt(note, lines)
    mentioned, events = [], []
    text = "<think>\n"
    while len(tok.encode(text).ids) < trace_tokens:
        if mentioned and rng.random() < 0.3:
            code = mentioned[int(rng.integers(len(mentioned)))]
            sibs = [c for c in codes if c[:3] == code[:3] and c != code]
            code = sibs[0] if sibs else code
        else:
            code = codes[int(rng.integers(len(codes)))]
        filler = " ".join(rng.choice(WORDS, int(rng.integers(12, 30))))
        sentence = f"The {filler} suggests {code} here. "
        at = len(text) + sentence.index(code)
        first = code not in mentioned
        near = next((m for m in mentioned if m[:3] == code[:3] and m != code), None)
        if first:
            events.append({"kind": "P1", "anchor": at, "code": code, "prefix": "",
                           "competitors": [f" {x}" for x in LETTERS if x != code[0]]})
            for k, ch in enumerate(code[1:], start=1):
                if ch != ".":
                    events.append({"kind": "P2", "anchor": at + k, "code": code, "prefix": code[:k],
                                   "competitors": [d for d in "0123456789" if d != ch][:3]})
            mentioned.append(code)
        if near is not None:
            k = next(i for i, (a, b) in enumerate(zip(code, near)) if a != b)
            events.append({"kind": "P2C", "anchor": at + k, "code": code, "prefix": code[:k], "near_miss": near,
                           "competitors": [near[k]]})
        text += sentence
    completion = text + f"\n</think>\n\n[\"{mentioned[0]}\"]"
    return prompt, completion, events


def subsample_events(events: list[dict], counts: dict[str, int], rng: np.random.Generator) -> list[dict]:
    """Keep at most counts[kind] events of each kind (seeded), in trace order."""
    keep = []
    for kind, n in counts.items():
        idx = [i for i, e in enumerate(events) if e["kind"] == kind]
        keep += rng.choice(idx, size=min(n, len(idx)), replace=False).tolist() if idx else []
    return [events[i] for i in sorted(keep)]


def random_pool(phase: str, n_layers: int, n_heads: int, k: int, rng: np.random.Generator) -> Pool:
    """40 heads, mostly in the later half of the network (as the paper's pools are), softmax(I_c/tau) weights."""
    layers = rng.integers(n_layers // 2, n_layers, size=k)
    heads = rng.integers(0, n_heads, size=k)
    pairs = list(dict.fromkeys(zip(layers.tolist(), heads.tolist())))
    while len(pairs) < k:
        pairs = list(dict.fromkeys(pairs + [(int(rng.integers(n_layers)), int(rng.integers(n_heads)))]))
    ic = np.sort(rng.gamma(0.5, 0.1, size=k))[::-1]
    return Pool(phase, tuple(pairs[:k]), tuple(softmax_weights(ic).tolist()))


def teacher_targets(view, n_buckets: int, window: int, rng) -> dict:
    """Random teacher quantities of the right shapes (the step's cost does not depend on their values)."""
    out = {}
    for phase in ("P1", "P2", "P2C"):
        idx = [ev.index for ev in view.realized if ev.kind == phase]
        if idx:
            out[phase] = {"rows": rng.dirichlet(np.ones(n_buckets), size=len(idx)).astype(np.float32),
                          "m": rng.random(len(idx)).astype(np.float32),
                          "c": rng.normal(size=len(idx)).astype(np.float32), "event_index": np.array(idx)}
    p1 = [ev for ev in view.realized if ev.kind == "P1"]
    pairs = [(ev.index, d) for ev in p1 for d in range(window, 0, -1) if ev.row - d >= 1]
    out["window"] = {"rows": rng.dirichlet(np.ones(n_buckets), size=len(pairs)).astype(np.float32),
                     "event_index": np.array([p[0] for p in pairs]), "distance": np.array([p[1] for p in pairs])}
    return out


def build_model(shape: str, device: str, seq_len: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**SHAPES[shape], max_position_embeddings=max(40960, seq_len + 16), rope_theta=1_000_000.0,
                      tie_word_embeddings=True, attn_implementation="sdpa")
    torch.manual_seed(0)
    dtype = torch.bfloat16
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model


def run_arm(arm_name: str, args, batch: arms.NoteBatch, pools) -> dict:
    device = torch.device(args.device)
    model = build_model(args.shape, args.device, len(batch.ids))
    cfg = TrainConfig(precision="bf16", gradient_checkpointing=True,
                      offload_checkpoints=bool(args.offload) and device.type == "cuda", mlp_chunk=args.mlp_chunk)
    model = prepare_model(model, cfg)
    opt, _ = make_optimizer(list(model.parameters()), cfg, total_steps=10)
    arm = arms.ArmConfig(arm=arm_name, window=args.window, logit_chunk=args.logit_chunk, row_chunk=args.row_chunk)
    rows_hook = SupervisedRows(model, supervised_layers(pools, pools["P1"]), row_chunk=args.row_chunk) \
        if arm_name == "mistill" else None

    def micro_step():
        loss, log = arms.note_loss(model, batch, arm, pools, rows_hook)
        loss.backward()
        return log

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # warm-up: one note and one optimiser step, so AdamW's states exist as in every later step
    micro_step()
    opt.step()
    opt.zero_grad(set_to_none=False)  # keep the gradient buffers, as accumulation does
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, logs = [], []
    for _ in range(args.notes):
        sync()
        t0 = time.perf_counter()
        logs.append(micro_step())
        sync()
        times.append(time.perf_counter() - t0)
    peak_micro = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    t0 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=False)
    sync()
    opt_time = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    out = {"seconds_per_note": float(np.mean(times)), "seconds_per_note_all": times,
           "optimizer_step_s": opt_time, "peak_memory_gib": None if peak is None else peak / 2**30,
           "peak_forward_backward_gib": None if peak_micro is None else peak_micro / 2**30,
           "loss": logs[-1]["loss"], "log": {k: v for k, v in logs[-1].items() if isinstance(v, float)}}
    if rows_hook is not None:
        rows_hook.remove()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-4b")
    ap.add_argument("--prompt-tokens", type=int, default=30000)
    ap.add_argument("--trace-tokens", type=int, default=6000)
    ap.add_argument("--pool-k", type=int, default=40)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--events", type=int, default=255, help="events per note (paper median 255, App. I.5)")
    ap.add_argument("--p1-events", type=int, default=38, help="P1 events (562 rows = 255 + 8 x 38)")
    ap.add_argument("--p2c-events", type=int, default=20)
    ap.add_argument("--notes", type=int, default=2, help="measured micro-steps per arm (after one warm-up)")
    ap.add_argument("--logit-chunk", type=int, default=256)
    ap.add_argument("--offload", type=int, default=1, help="hold checkpointed layer inputs in host memory (1/0)")
    ap.add_argument("--mlp-chunk", type=int, default=4096, help="tokens per checkpointed MLP chunk (0: off)")
    ap.add_argument("--row-chunk", type=int, default=256)
    ap.add_argument("--arms", default="vanilla,mistill")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    shape = SHAPES[args.shape]
    tok = SyntheticTokenizer(shape["vocab_size"])
    t0 = time.perf_counter()
    prompt, completion, events = synthetic_note(tok, args.prompt_tokens, args.trace_tokens, rng)
    # App. I.5: per note a median of 255 events and 562 supervised rows (= 255 + 8 x ~38 P1 events)
    events = subsample_events(events, {"P1": args.p1_events, "P2C": args.p2c_events,
                                       "P2": args.events - args.p1_events - args.p2c_events}, rng)
    axis = bk.build_axis(prompt, completion)
    view = note_view(tok, axis, events, [e["competitors"] for e in events])
    n_layers, n_heads = shape["num_hidden_layers"], shape["num_attention_heads"]
    k = min(args.pool_k, n_layers * n_heads // 2)
    pools = {p: random_pool(p, n_layers, n_heads, k, rng) for p in ("P1", "P2", "P2C")}
    ids = torch.tensor(view.ids)
    labels = torch.full_like(ids, -100)
    labels[view.completion_token - 1:-1] = ids[view.completion_token:]
    top_ids = torch.randint(0, shape["vocab_size"], (len(ids), 32))
    top_logp = torch.log_softmax(torch.randn(len(ids), 32), -1)
    batch = arms.NoteBatch("synthetic", ids, labels, top_ids, top_logp, uld=False, view=view, events=events,
                           teacher=teacher_targets(view, axis.n_buckets, args.window, rng))
    kinds = [ev.kind for ev in view.realized]
    setup_s = time.perf_counter() - t0
    summary = {"shape": args.shape, "device": args.device,
               "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
               "torch": torch.__version__, "prompt_tokens": view.completion_token,
               "trace_tokens": len(view.ids) - view.completion_token, "buckets": axis.n_buckets,
               "events": {k2: kinds.count(k2) for k2 in ("P1", "P2", "P2C")},
               "supervised_rows": len(kinds) + sum(1 for k2 in kinds if k2 == "P1") * args.window,
               "pool_k": k, "pool_layers": len(supervised_layers(pools, pools["P1"])), "setup_s": setup_s,
               "precision": "bf16 weights, no fp32 master copy, fused AdamW, gradient checkpointing, sdpa",
               "offload_checkpoints": bool(args.offload), "logit_chunk": args.logit_chunk,
               "mlp_chunk": args.mlp_chunk, "arms": {}}
    for name in args.arms.split(","):
        summary["arms"][name] = run_arm(name, args, batch, pools)
        gc.collect()  # the arm's model and optimiser are gone; free their memory before the next arm
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if {"vanilla", "mistill"} <= set(summary["arms"]):
        v, m = summary["arms"]["vanilla"], summary["arms"]["mistill"]
        summary["mistill_over_vanilla_time"] = m["seconds_per_note"] / v["seconds_per_note"]
        if v["peak_memory_gib"] is not None:
            summary["goals"] = {"time_ratio_le_1.2": summary["mistill_over_vanilla_time"] <= 1.2,
                                "vanilla_peak_le_37.5GiB": v["peak_memory_gib"] <= 37.5,
                                "mistill_peak_le_37.5GiB": m["peak_memory_gib"] <= 37.5}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
