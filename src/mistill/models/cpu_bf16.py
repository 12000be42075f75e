"""bf16 matrix products on CPUs without bf16 instructions, computed as fp32 products of bf16 operands.

The demo trains and evaluates under bf16 (App. J.2: the `bf16` arm holds bf16 weights, the `fp32`
arm computes under bf16 autocast).  oneDNN runs a bf16 GEMM natively where the CPU has AVX-512
(with or without its BF16 extension, or AMX); on a CPU with AVX2 only, torch falls back to a scalar
bf16 kernel about 36 times slower than the fp32 GEMM of the same shape (measured on an AMD EPYC with
AVX2: 1200x960 @ 960x960, 1.93 s against 53 ms; 71 ms through fp32 here).  A demo student's
training step (forward and backward) at 2,048 tokens takes 1.69-1.72 s natively and 0.37-0.41 s
this way (4.2x fp32 arm, 4.7x bf16 arm; `benchmarks/bench_cpu_bf16.py`, `benchmarks/results/
cpu_bf16_2core_epyc_avx2.json`); what remains is bf16 elementwise work and dtype conversions.

On such a CPU, `install()` routes every bf16 GEMM through fp32 instead.  It loses nothing: a
product of two bf16 numbers (8-bit significands) is exact in fp32 (24 bits), and a native bf16
GEMM accumulates in fp32 as well, so the emulated product differs from the native one only in the
order of its fp32 sums, which is what any two CPUs' kernels differ in anyway.  The result is
rounded to bf16, as the native kernel's is.  The CPU flash-attention kernel (forward and backward)
is routed the same way; run in fp32 it also keeps the attention probabilities in fp32 where the
bf16 kernel rounds them before their product with the values, so its outputs and gradients differ
from the native ones by one or two bf16 units in the last place (tested), the size of a
cross-CPU difference.

The routing is a `TorchDispatchMode`: it sits below autograd and autocast, so it sees the GEMMs of
the backward pass and the operands autocast has already rounded to bf16, and leaves every other
operation, and every GEMM with no bf16 operand, untouched.  Every operation passes through Python
on its way, a few microseconds each: negligible beside a CPU's GEMMs, not beside a GPU's, so `auto`
leaves a process that sees a CUDA device alone.  `MISTILL_BF16_GEMM` overrides the choice: `auto`
(default: emulate where oneDNN has no bf16 kernel and no GPU is visible), `emulate` or `native`.
"""

from __future__ import annotations

import os

from mistill.errors import UserError

ENV = "MISTILL_BF16_GEMM"
CHOICES = ("auto", "emulate", "native")

_installed = None   # the mode entered for the rest of the process, once


def _bf16_gemm_ops():
    import torch

    aten = torch.ops.aten
    gemms = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default,
             aten.addbmm.default, aten.mv.default, aten.addmv.default, aten.dot.default}
    flash = {aten._scaled_dot_product_flash_attention_for_cpu.default,
             aten._scaled_dot_product_flash_attention_for_cpu_backward.default}
    return gemms, flash


def make_mode():
    """A dispatch mode that computes bf16 CPU GEMMs (and CPU flash attention) in fp32, rounding results to bf16."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten, tree_map

    gemms, flash = _bf16_gemm_ops()
    bf16 = torch.bfloat16

    def is_bf16_cpu(x) -> bool:
        return isinstance(x, torch.Tensor) and x.dtype == bf16 and x.device.type == "cpu"

    def widen(x):
        return x.float() if is_bf16_cpu(x) else x

    class EmulatedBF16Gemm(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in gemms or func in flash:
                if any(is_bf16_cpu(x) for x in tree_flatten((args, kwargs))[0]):
                    out = func(*tree_map(widen, args), **tree_map(widen, kwargs))
                    if func in gemms:
                        return out.to(bf16)
                    # flash forward returns (output, logsumexp): the output in the input's dtype, the
                    # logsumexp in fp32 as the native kernel gives it; the backward returns the three grads.
                    if func is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:
                        return out[0].to(bf16), out[1]
                    return tuple(g.to(bf16) if g is not None else None for g in out)
            return func(*args, **kwargs)

    return EmulatedBF16Gemm()


def native_bf16_gemm() -> bool:
    """Whether oneDNN has a bf16 GEMM kernel for this CPU (AVX-512 core or newer)."""
    import torch

    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def wanted(choice: str | None = None) -> bool:
    """Whether bf16 GEMMs should be emulated, by `MISTILL_BF16_GEMM` (or `choice`) and the CPU."""
    choice = (choice if choice is not None else os.environ.get(ENV, "auto")).strip().lower() or "auto"
    if choice not in CHOICES:
        raise UserError(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "auto":
        import torch

        return not native_bf16_gemm() and not torch.cuda.is_available()
    return choice == "emulate"


def install(choice: str | None = None) -> bool:
    """Enter the emulating mode for the rest of the process where `wanted()`; True when it is active."""
    global _installed
    if _installed is None and wanted(choice):
        _installed = make_mode()
        _installed.__enter__()
    return _installed is not None
