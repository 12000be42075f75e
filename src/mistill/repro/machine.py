"""Which machine a number came from, as provenance names it.

Goldens of trained students hold exactly only within a CPU type: kernels that round differently
(AVX2 against AVX-512, bf16 products in AMX or through fp32) train other weights, and training
amplifies the difference (README "Tolerances from replicates"). So provenance names the CPU model
and the kernel family torch dispatches to, beside the host and core count.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform reports, else "unknown CPU"."""
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def torch_cpu_capability() -> str | None:
    """The vector ISA torch's CPU kernels dispatch to ("AVX512", "AVX2", ...), None without torch."""
    try:
        import torch
    except ImportError:
        return None
    return str(torch.backends.cpu.get_cpu_capability())


def describe_machine() -> str:
    capability = torch_cpu_capability()
    kernels = f", torch CPU capability {capability}" if capability else ""
    return (f"{platform.node()} ({cpu_model()}{kernels}, {platform.machine()}, {os.cpu_count()} CPUs, "
            f"{platform.system()} {platform.release()})")
