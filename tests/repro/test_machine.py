"""Provenance names the CPU type: goldens of trained students hold exactly only within one."""

import os
import platform

from mistill.repro.machine import cpu_model, cpu_type, describe_machine, torch_cpu_capability

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu avx2

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 7B13
"""


def test_cpu_model_reads_the_first_model_name(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    assert cpu_model(path) == "AMD EPYC 7B13"


def test_cpu_model_without_cpuinfo_falls_back_to_the_platform(tmp_path):
    assert cpu_model(tmp_path / "absent") == (platform.processor() or "unknown CPU")


def test_describe_machine_names_cpu_and_kernels():
    text = describe_machine()
    assert cpu_model() in text and platform.node() in text
    assert f"torch CPU capability {torch_cpu_capability()}" in text      # torch is a dependency


def test_cpu_type_names_vendor_family_and_model_not_the_host(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    kernels = f", torch CPU capability {torch_cpu_capability()}"
    assert cpu_type(path) == f"AuthenticAMD family 25 model 1{kernels}, {os.cpu_count()} CPUs"   # the first CPU's
    assert platform.node() not in cpu_type(path)
    path.write_text("processor\t: 0\nmodel name\t: Some CPU\n")                    # no family numbers
    assert cpu_type(path) == f"Some CPU{kernels}, {os.cpu_count()} CPUs"
