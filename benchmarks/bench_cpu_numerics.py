"""Which CPU settings make a training step give the same bits on another machine, and what they cost.

A float sum depends on its order, and torch on a CPU chooses the order by hardware: ATen's
vectorised kernels dispatch on the widest ISA (AVX2 or AVX-512), MKL's GEMM picks a code branch
per ISA and splits work by thread count, and oneDNN (bf16 matmuls, the fused CPU attention) uses
AMX or AVX-512-BF16 units only where the CPU has them. This benchmark runs three AdamW steps of a
randomly initialised model of the demo student's shape (sdpa attention, like the trainer) in a fresh
process per setting and reports a hash of the final weights and the seconds per step, side by side:

* `native`: torch's defaults (what every stage runs today);
* `mkl-strict`: MKL's conditional numerical reproducibility, AVX2 branch, thread-count independent;
* `pinned-avx2`: that, plus ATen dispatch pinned to AVX2 and oneDNN capped at AVX2 (the
  settings an AVX2-only machine would get by itself);
* `pinned-avx512`: the same pins at AVX-512 (a machine without AVX-512 cannot run it).

Two settings whose hashes agree at 1 and 2 threads are thread-independent; a pinned setting gives
what any x86 machine with at least that ISA gives, since every kernel choice is fixed.

    python benchmarks/bench_cpu_numerics.py                 # both precisions, table + JSON to stdout
    python benchmarks/bench_cpu_numerics.py --out benchmarks/results/cpu_numerics.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
SETTINGS = {
    "native": {},
    "mkl-strict": {"MKL_CBWR": "AVX2,STRICT"},
    "pinned-avx2": {"MKL_CBWR": "AVX2,STRICT", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "pinned-avx512": {"MKL_CBWR": "AVX512,STRICT", "ATEN_CPU_CAPABILITY": "avx512",
                      "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
}
STUDENT = {"family": "qwen3", "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 4,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}


def child(precision: str, threads: int, steps: int, tokens: int) -> dict:
    sys.path.insert(0, str(SRC))
    import torch

    from mistill.models.architectures import TinyArchitecture, build_model

    torch.set_num_threads(threads)
    model = build_model(TinyArchitecture(**STUDENT), vocab_size=4096, eos_token_id=1, pad_token_id=0, seed=0,
                        attn_implementation="sdpa")
    model = model.to(torch.bfloat16 if precision == "bf16" else torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(2, 4096, (2, tokens), generator=torch.Generator().manual_seed(0))
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        seconds.append(time.perf_counter() - start)
    digest = hashlib.md5()
    for name, p in sorted(model.state_dict().items()):
        digest.update(p.detach().float().numpy().tobytes())
    return {"weights_md5": digest.hexdigest()[:12], "loss": float(loss), "s_per_step": min(seconds[1:] or seconds),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("PRECISION", "THREADS"), help=argparse.SUPPRESS)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per sequence (batch of 2)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.steps, args.tokens)))
        return 0
    rows = []
    for precision in args.precisions.split(","):
        for name, env in SETTINGS.items():
            for threads in (1, 2):
                cmd = [sys.executable, __file__, "--child", precision, str(threads), "--steps", str(args.steps),
                       "--tokens", str(args.tokens)]
                done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
                row = {"precision": precision, "setting": name, "threads": threads, "env": env}
                if done.returncode == 0:
                    row.update(json.loads(done.stdout.strip().splitlines()[-1]))
                else:
                    row["error"] = (done.stderr.strip().splitlines() or ["?"])[-1][:200]
                rows.append(row)
                print(f"{precision:5} {name:14} t{threads}  {row.get('weights_md5', '-'):12}  "
                      f"{row.get('s_per_step', float('nan')):.3f} s/step  {row.get('error', '')}", flush=True)
    report = {"benchmark": "bench_cpu_numerics", "machine": platform.processor() or platform.machine(),
              "cpu_flags": sorted(_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}), "rows": rows}
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


def _flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


if __name__ == "__main__":
    raise SystemExit(main())
