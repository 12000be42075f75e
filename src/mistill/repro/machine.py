"""Which machine a number came from, as provenance names it.

Goldens of trained students hold exactly only within a CPU type: kernels that round differently
(AVX2 against AVX-512, bf16 products in AMX or through fp32) train other weights, and training
amplifies the difference (docs/tolerances.md). So provenance names the CPU model
and the kernel family torch dispatches to, beside the host and core count.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def _first_cpu(cpuinfo: Path) -> dict[str, str]:
    """The fields of the first processor in Linux's /proc/cpuinfo ({} where there is none)."""
    fields: dict[str, str] = {}
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            name, _, value = line.partition(":")
            if not name.strip() and fields:
                break                       # the blank line after the first processor
            fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform reports, else "unknown CPU"."""
    return _first_cpu(cpuinfo).get("model name") or platform.processor() or "unknown CPU"


def cpu_type(cpuinfo: Path = CPUINFO) -> str:
    """What makes two machines compute alike: the CPU's vendor, family and model numbers (a model name such
    as "Intel(R) Xeon(R) Processor" can stand for several), the kernels torch dispatches to and the core
    count; not the host's name or kernel release, which a rebuilt machine of the same type may change."""
    cpu = _first_cpu(cpuinfo)
    numbers = (f"{cpu.get('vendor_id', '')} family {cpu['cpu family']} model {cpu['model']}"
               if "cpu family" in cpu and "model" in cpu else cpu_model(cpuinfo))
    capability = torch_cpu_capability()
    kernels = f", torch CPU capability {capability}" if capability else ""
    return f"{numbers.strip()}{kernels}, {os.cpu_count()} CPUs"


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
