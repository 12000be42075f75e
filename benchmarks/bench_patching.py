"""Patches per second: brute force, cached, cached + batched (App. C "Compute"; DESIGN "exact instrument").

One exact patch = one head mean-ablated at one position q, margin read at q.

* brute force: a full forward of tokens [0, q] with the head replaced at q;
* cached (stock): one token against transformers' DynamicCache, cropped back after
  each forward (the paper's path: 72 ms per forward at 110k tokens on an H200);
* cached (PatchCache): one token against the preallocated cache (no copy per forward);
* cached + batched (masked): B variants of the token at q as one forward against the shared
  cache, each attending to the cache and itself only through a 4D mask;
* cached + batched (split): the same, with the cache attended once per key head without a mask
  (flash attention on CUDA) and each token's self term merged by log-sum-exp.

CPU (demo shape, side by side):
    python benchmarks/bench_patching.py
GPU, a randomly initialised model of Qwen3-14B's shape (40 layers x 40 heads, 8 KV heads):
    python benchmarks/bench_patching.py --device cuda --shape qwen3-14b --context 30000,110000
`--layers N` builds only N of the layers and scales times by layers/N (reported).  The cache is
filled with random keys and values of the right size (a patch's cost does not depend on their
values), so no 110k-token prefill is needed.  Prints one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from mistill.models.loading import cast_weights

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from mistill.instrument.hook import HeadHook, Replacement
from mistill.instrument.margin import margin
from mistill.instrument.patching import PatchCache, brute_force_logits, forward_variants

PAPER_MS_PER_FORWARD_110K = 72.0  # App. C "Compute": single-token forward against a 110k cache, H200

SHAPES = {
    # Qwen3-14B (config.json of Qwen/Qwen3-14B)
    "qwen3-14b": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936),
    # the demo teacher (params.yaml demo.models.architectures.teacher)
    "demo": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=2, head_dim=16, vocab_size=4096),
}


def build(shape: str, layers: int | None, dtype: torch.dtype, device: str) -> Qwen3ForCausalLM:
    sizes = dict(SHAPES[shape])
    if layers:
        sizes["num_hidden_layers"] = layers
    cfg = Qwen3Config(**sizes, max_position_embeddings=163840, rope_theta=1_000_000.0, tie_word_embeddings=False,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = cast_weights(Qwen3ForCausalLM(cfg), dtype)   # RoPE's inv_freq stays fp32
    return model.eval().requires_grad_(False)


def random_patch_cache(model, context: int, reserve: int) -> PatchCache:
    cfg = model.config
    cache = PatchCache(cfg.num_hidden_layers, context + reserve)
    p = next(model.parameters())
    g = torch.Generator(device=p.device).manual_seed(0)
    for layer in cache.layers:
        shape = (1, cfg.num_key_value_heads, context + reserve, cfg.head_dim)
        layer.dtype, layer.device, layer.is_initialized = p.dtype, p.device, True
        layer.key_buffer = torch.randn(shape, generator=g, device=p.device, dtype=p.dtype)
        layer.value_buffer = torch.randn(shape, generator=g, device=p.device, dtype=p.dtype)
        layer.length = context
    return cache


def dynamic_cache_from(cache: PatchCache, context: int) -> DynamicCache:
    dyn = DynamicCache()
    for i, layer in enumerate(cache.layers):
        dyn.update(layer.key_buffer[..., :context, :].clone(), layer.value_buffer[..., :context, :].clone(), i)
    return dyn


def timed(fn, repeats: int, device: str) -> float:
    """Median seconds of `repeats` calls after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def one_head_masks(hook: HeadHook, n: int) -> torch.Tensor:
    heads = [(i // hook.n_heads % hook.n_layers, i % hook.n_heads) for i in range(n)]
    mask = torch.zeros(hook.n_layers, n, hook.n_heads, dtype=torch.bool)
    for b, (layer, head) in enumerate(heads):
        mask[layer, b, head] = True
    return mask


def bench_context(model, hook, context: int, batch: int, repeats: int, device: str, brute: bool) -> dict:
    cfg = model.config
    mu = torch.zeros(hook.n_layers, hook.n_heads, hook.head_dim, device=device)
    token, target, competitors = 7, 11, [13, 17, 19]
    cache = random_patch_cache(model, context, reserve=batch)
    mask1 = one_head_masks(hook, 1).to(device)
    maskb = one_head_masks(hook, batch).to(device)
    row: dict = {"context": context}
    with torch.no_grad():
        row["patch_cache_single_ms"] = 1e3 * timed(
            lambda: margin(forward_variants(model, hook, cache, context, token, Replacement(mask1, mu), 1),
                           target, competitors), repeats, device)
        t_batch = timed(lambda: margin(forward_variants(model, hook, cache, context, token,
                                                        Replacement(maskb, mu), batch, split_attention=True),
                                       target, competitors),
                        repeats, device)
        row["batched_ms_per_forward"] = 1e3 * t_batch
        row["batched_ms_per_patch"] = 1e3 * t_batch / batch
        t_masked = timed(lambda: margin(forward_variants(model, hook, cache, context, token, Replacement(maskb, mu),
                                                         batch, split_attention=False), target, competitors),
                         repeats, device)
        row["batched_masked_ms_per_forward"] = 1e3 * t_masked
        row["batched_masked_ms_per_patch"] = 1e3 * t_masked / batch
        # the two batched paths compute the same function: report their largest logit difference
        split = forward_variants(model, hook, cache, context, token, Replacement(maskb, mu), batch,
                                 split_attention=True)
        masked = forward_variants(model, hook, cache, context, token, Replacement(maskb, mu), batch,
                                  split_attention=False)
        single = forward_variants(model, hook, cache, context, token, Replacement(mask1, mu), 1)
        row["max_abs_logit_diff_split_vs_masked"] = float((split - masked).abs().max())
        row["max_abs_logit_diff_batched_vs_single"] = float((split[0] - single[0]).abs().max())
        del split, masked, single
        dyn = dynamic_cache_from(cache, context)

        def stock():
            out = model(input_ids=torch.tensor([[token]], device=device), past_key_values=dyn, use_cache=True)
            dyn.crop(-1)
            return margin(out.logits[0, -1], target, competitors)

        with hook.replacing(Replacement(mask1, mu)):
            row["stock_dynamic_cache_single_ms"] = 1e3 * timed(stock, repeats, device)
        if brute:
            ids = torch.randint(0, cfg.vocab_size, (context,)).tolist()
            head_mask = mask1[:, 0].cpu()
            row["brute_force_ms"] = 1e3 * timed(
                lambda: brute_force_logits(model, hook, ids, token, head_mask, mu), max(1, repeats // 3), device)
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shape", default="demo", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=None, help="build only N layers; times scaled by L/N")
    parser.add_argument("--context", default=None, help="comma-separated cache lengths (default: 2000 on CPU)")
    parser.add_argument("--batch", type=int, default=None, help="variants per batched forward (CPU 32, GPU 128)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"])
    parser.add_argument("--no-brute", action="store_true", help="skip the brute-force full forward")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 2
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))
    contexts = [int(c) for c in (args.context or "2000").split(",")]
    batch = args.batch or (128 if args.device == "cuda" else 32)
    full_layers = SHAPES[args.shape]["num_hidden_layers"]
    model = build(args.shape, args.layers, dtype, args.device)
    hook = HeadHook(model)
    built = model.config.num_hidden_layers
    scale = full_layers / built
    rows = []
    for context in contexts:
        row = bench_context(model, hook, context, batch, args.repeats, args.device,
                            brute=not args.no_brute and (args.device == "cpu" or context <= 32768))
        if scale != 1:  # layers are identical in cost: a full model takes L/N times as long
            row = {k: (v * scale if k.endswith("_ms") or "_ms_per_" in k else v) for k, v in row.items()}
        per_patch = row["batched_ms_per_patch"]
        row["patches_per_second"] = {
            "brute_force": 1e3 / row["brute_force_ms"] if "brute_force_ms" in row else None,
            "cached_stock": 1e3 / row["stock_dynamic_cache_single_ms"],
            "cached_patch_cache": 1e3 / row["patch_cache_single_ms"],
            "cached_batched_masked": 1e3 / row["batched_masked_ms_per_patch"],
            "cached_batched": 1e3 / per_patch,
        }
        if args.shape == "qwen3-14b":  # the paper's 72 ms is a Qwen3-14B forward on an H200
            row["speedup_vs_paper_72ms"] = {
                "cached_stock": PAPER_MS_PER_FORWARD_110K / row["stock_dynamic_cache_single_ms"],
                "cached_batched_masked": PAPER_MS_PER_FORWARD_110K / row["batched_masked_ms_per_patch"],
                "cached_batched": PAPER_MS_PER_FORWARD_110K / per_patch}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    summary = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "shape": args.shape, "layers_built": built, "layers_full": full_layers,
        "times_scaled_by": scale, "dtype": str(dtype).removeprefix("torch."), "batch": batch,
        "threads": args.threads, "paper_ms_per_single_token_forward_110k": PAPER_MS_PER_FORWARD_110K,
        "torch": torch.__version__, "results": rows,
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
