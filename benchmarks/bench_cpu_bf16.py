"""bf16 training steps on the CPU: torch's own bf16 GEMM against `mistill.models.cpu_bf16`'s fp32 route.

One forward + backward of the demo's Qwen3 student (`models/demo/student-qwen`) on one sequence of
random tokens, in both precision arms of App. J.2 (`fp32`: fp32 weights under bf16 autocast;
`bf16`: bf16 weights), each arm run with the native kernel and with the emulating dispatch mode,
alternating over repeats in one process.  Reports seconds per step, the ratio native / emulated,
and how far the emulated loss sits from the native one.  On a CPU with AVX-512 oneDNN's bf16 kernel
is fast and `mistill` never installs the mode; on an AVX2-only CPU the native kernel is scalar.

    python benchmarks/bench_cpu_bf16.py                     # 1,024 tokens, 2 threads, 3 repeats
    python benchmarks/bench_cpu_bf16.py --tokens 2048 --repeats 5 --out benchmarks/results/x.json
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


def cpu_model() -> str:
    """The processor's model name (Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def step_seconds(model, ids, *, autocast: bool, mode) -> tuple[float, float]:
    import contextlib

    import torch

    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with mode if mode is not None else contextlib.nullcontext():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    return time.perf_counter() - start, loss.item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "demo" / "student-qwen")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from mistill.models import cpu_bf16

    torch.set_num_threads(args.threads)
    vocab = json.loads((args.model / "config.json").read_text())["vocab_size"]
    ids = torch.randint(3, vocab, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    arms = {"fp32": dict(dtype=torch.float32, autocast=True), "bf16": dict(dtype=torch.bfloat16, autocast=False)}
    report = {"cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
              "native_bf16_gemm": cpu_bf16.native_bf16_gemm(), "tokens": args.tokens, "threads": args.threads,
              "repeats": args.repeats, "arms": {}}
    for arm, spec in arms.items():
        model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=spec["dtype"])
        model.config.use_cache = False
        times = {"native": [], "emulated": []}
        losses = {}
        step_seconds(model, ids, autocast=spec["autocast"], mode=cpu_bf16.make_mode())   # warm-up
        for r in range(args.repeats):
            order = ["native", "emulated"] if r % 2 == 0 else ["emulated", "native"]
            for path in order:
                mode = cpu_bf16.make_mode() if path == "emulated" else None
                seconds, loss = step_seconds(model, ids, autocast=spec["autocast"], mode=mode)
                times[path].append(seconds)
                losses[path] = loss
        native, emulated = min(times["native"]), min(times["emulated"])
        report["arms"][arm] = {"native_s": native, "emulated_s": emulated, "native_over_emulated": native / emulated,
                               "loss_native": losses["native"], "loss_emulated": losses["emulated"],
                               "loss_abs_diff": abs(losses["native"] - losses["emulated"])}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
