"""Teacher-trace sampling, one note at a time against batches: wall time and identical tokens, one run.

The demo's teacher traces (TR-006/7/8) used to be sampled one prompt per `model.generate` call,
the global generator reseeded before each. They are now sampled in left-padded batches, one
generator per row (`mistill.models.sampling`). This benchmark samples the same prompts both ways
in one process, alternating the order of the two arms over repeats, and reports seconds per note,
the ratio, and whether every completion is the same token for token:

* `generate-per-note`: transformers' `generate(do_sample=True)` per prompt after
  `torch.manual_seed(seed)` (the old path);
* `batch-1`, `batch-8`, `batch-16`: `mistill.models.generation.generate` with that batch size.

Prompts are the demo's shortlist prompts (TR-008's) when `artifacts/data` exists, so run it after
`dvc repro TR-008` or `dvc pull`; the teacher is the committed `models/demo/teacher`.

    python benchmarks/bench_generation.py                    # 32 notes, threads from params (2)
    python benchmarks/bench_generation.py --notes 64 --max-new-tokens 512 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def per_note(model, tokenizer, prompts, seeds, decoding):
    import torch

    from mistill.models.generation import completion_of

    out = []
    for prompt, seed in zip(prompts, seeds):
        ids = tokenizer.encode(tokenizer.chat_prompt(prompt)).ids
        torch.manual_seed(seed)
        with torch.no_grad():
            gen = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=True, temperature=decoding.temperature, top_p=decoding.top_p,
                                 top_k=decoding.top_k, max_new_tokens=decoding.max_new_tokens,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        out.append(completion_of(prompt, gen[0, len(ids):].tolist(), tokenizer, seed))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notes", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: params decoding")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()

    import os

    os.chdir(ROOT)
    import torch

    from mistill.models.generation import Decoding, generate
    from mistill.models.loading import ModelSpec, load_model, set_threads
    from mistill.models.world_files import SHORTLIST, load_world
    from mistill.params import load_params
    from mistill.world.notes import load_notes

    params = load_params()
    set_threads(params["models"], None)
    if not Path("artifacts/data/shortlists.jsonl").exists():
        print("bench_generation: no artifacts/data (run `dvc repro RT-003` or `dvc pull` first); skipped")
        return 0
    world = load_world(params, need_shortlists=True)
    notes = load_notes(Path("artifacts/data/dt_train.jsonl"), world.inventory)[:args.notes]
    prompts = [world.prompt(n, SHORTLIST) for n in notes]
    seeds = [int(params["seeds"]["decoding"])] * len(prompts)    # App. B: one seed for every teacher trace
    decoding = Decoding.from_params({**params["decoding"], **({"max_new_tokens": args.max_new_tokens}
                                                               if args.max_new_tokens else {})})
    attn = params["models"].get("generation_attn_implementation", "sdpa")
    model, tokenizer = load_model(ModelSpec.from_params(params["models"], params["models"]["teacher"],
                                                        base="teacher", attn_implementation=attn), device="cpu")
    model.eval()
    arms = {"generate-per-note": lambda: per_note(model, tokenizer, prompts, seeds, decoding)}
    for size in (1, 8, 16):
        arms[f"batch-{size}"] = lambda size=size: generate((model, tokenizer), prompts, seeds=seeds,
                                                           decoding=decoding, batch_size=size)
    seconds = {name: [] for name in arms}
    outputs = {}
    for repeat in range(args.repeats):
        order = list(arms) if repeat % 2 == 0 else list(arms)[::-1]
        for name in order:
            start = time.perf_counter()
            outputs[name] = arms[name]()
            seconds[name].append(time.perf_counter() - start)
    reference = outputs["generate-per-note"]
    base = min(seconds["generate-per-note"])
    rows = {name: {"seconds": round(min(s), 2), "seconds_per_note": round(min(s) / len(prompts), 3),
                   "speedup_vs_per_note": round(base / min(s), 2), "identical_to_per_note": outputs[name] == reference,
                   "new_tokens": sum(g.n_new_tokens for g in outputs[name])}
            for name, s in seconds.items()}
    result = {"benchmark": "generation", "notes": len(prompts), "max_new_tokens": decoding.max_new_tokens,
              "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.processor() or
              platform.machine(), "repeats": args.repeats, "arms": rows}
    width = max(len(n) for n in rows)
    for name, row in rows.items():
        print(f"{name:{width}s}  {row['seconds']:8.2f} s  {row['seconds_per_note']:6.3f} s/note  "
              f"x{row['speedup_vs_per_note']:<5}  identical: {row['identical_to_per_note']}")
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
