"""Prefix-edit re-feeds per second: one forward per variant against packs beside the prefill (App. E).

A prefix edit replaces the tokens [s, t) of a note and re-feeds s .. q - 1 before reading the
decision at q, plain and with two heads mean-ablated.  Two ways, side by side on one model and one
note, each timed over the same variants:

* one per variant: crop the cache to s, feed the variant's tokens in place, read at q (two forwards
  a variant; what `prefix_edit_note` does with a variant too long for a pack);
* packed: variants appended after the prefill's keys, `pack_tokens` at a time, each seeing the
  prefill below its s and its own tokens through the mask (`mistill.instrument.edits.refeed_packed`).

The note and the variants follow the demo's own-heads edits (re-feeds of median 56 and mean 117
tokens, 11.5 events of four variants a note; measured on the 31 test notes of one arm).  Prints one JSON summary: seconds per note of each way, their
ratio, and the largest difference between the two ways' logits.

    python benchmarks/bench_edits.py [--packs 128,512,2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from mistill.instrument.edits import Refeed, mediation_replacement, packs, refeed_in_place, refeed_packed
from mistill.instrument.hook import HeadHook
from mistill.instrument.patching import prefill

# the demo student's shape (params.yaml demo.models.architectures.student_qwen), its vocabulary
SHAPE = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=906)
HEADS = ((1, 0), (3, 2))


def build() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(**SHAPE, max_position_embeddings=4096, tie_word_embeddings=False, attn_implementation="sdpa")
    return Qwen3ForCausalLM(cfg).eval()


def demo_refeeds(note: list[int], n_variants: int, seed: int) -> list[Refeed]:
    """Variants of the demo's edits' lengths (a log-normal re-feed length of median about 56 tokens,
    capped by the note) in the completion (the note's last half), four variants per event."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_variants // 4):
        width = int(min(len(note) // 2 - 2, rng.lognormal(np.log(52), 1.25) + 4))
        q = int(rng.integers(len(note) // 2 + width, len(note)))
        s = q - width
        for _ in range(4):
            span = rng.integers(0, SHAPE["vocab_size"], size=3).tolist()
            out.append(Refeed(s, [*span, *note[s + 3:q]], q, note[q]))
    return out


def one_per_variant(model, hook, pre, refeeds) -> list[torch.Tensor]:
    replacement = mediation_replacement(hook, pre, HEADS)
    logits = {i: refeed_in_place(model, hook, pre, refeeds[i], 2, replacement)
              for i in sorted(range(len(refeeds)), key=lambda i: -refeeds[i].start)}
    return [logits[i] for i in range(len(refeeds))]


def packed(model, hook, pre, refeeds, pack_tokens: int) -> list[torch.Tensor]:
    out = []
    for group in packs([r.width(2) for r in refeeds], pack_tokens):
        out += refeed_packed(model, hook, pre, [refeeds[i] for i in group], 2, HEADS)
    return out


def timed(fn, repeats: int) -> tuple[float, list[torch.Tensor]]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--note-tokens", type=int, default=700)
    parser.add_argument("--variants", type=int, default=48, help="four per event")
    parser.add_argument("--packs", default="128,512,2048", help="comma list of pack sizes in tokens")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many passes")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build()
    hook = HeadHook(model)
    note = np.random.default_rng(1).integers(0, SHAPE["vocab_size"], size=args.note_tokens).tolist()
    refeeds = demo_refeeds(note, args.variants, seed=2)
    sizes = [int(p) for p in args.packs.split(",")]
    with torch.no_grad():
        fresh = lambda: prefill(model, hook, note, reserve=max(sizes))
        base_s, base = timed(lambda: one_per_variant(model, hook, fresh(), refeeds), args.repeats)
        rows = []
        for size in sizes:
            seconds, logits = timed(lambda size=size: packed(model, hook, fresh(), refeeds, size), args.repeats)
            diff = max(float((a - b).abs().max()) for a, b in zip(base, logits))
            rows.append({"pack_tokens": size, "seconds_per_note": round(seconds, 4),
                         "speedup": round(base_s / seconds, 2), "max_abs_logit_diff": diff})
    hook.remove()
    widths = [len(r.tokens) for r in refeeds]
    print(json.dumps({"benchmark": "prefix_edit_refeeds", "threads": args.threads, "note_tokens": args.note_tokens,
                      "variants": len(refeeds), "refeed_tokens": {"median": float(np.median(widths)),
                                                                  "mean": float(np.mean(widths)), "total": sum(widths)},
                      "one_per_variant_seconds_per_note": round(base_s, 4), "packed": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
