"""The CPU's name and INT8 kernel class, read from /proc/cpuinfo-style text."""

from __future__ import annotations

from pathlib import Path

import pytest

from medrt.engine.hardware import cpu_flags, cpu_name, int8_kernels

XEON_SPR = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: another
"""
XEON_CLX = "model name\t: Intel(R) Xeon(R) Gold 6248\nflags\t\t: sse2 avx2 avx512f avx512bw avx512_vnni\n"
SKYLAKE = "model name\t: Intel(R) Xeon(R) Gold 6148\nflags\t\t: sse2 avx2 avx512f avx512bw\n"
ALDER = "model name\t: 12th Gen Intel(R) Core(TM) i7-12700\nflags\t\t: sse2 avx2 avx_vnni\n"
EPYC = "model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n"
GRAVITON = "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd evtstrm aes asimddp sve\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize("text, kernels", [(XEON_SPR, "amx"), (XEON_CLX, "vnni"), (ALDER, "vnni"),
                                           (SKYLAKE, "avx512"), (EPYC, "avx2"), (GRAVITON, "arm-dot")])
def test_the_int8_kernel_class_follows_the_cpu_flags(tmp_path: Path, text: str, kernels: str) -> None:
    """Exact 32-bit sums (AMX, VNNI, Arm dot products) and 16-bit saturating pair sums
    (AVX2, AVX-512 without VNNI) are different classes: an INT8 verdict holds for one."""
    path = tmp_path / "cpuinfo"
    path.write_text(text, encoding="utf-8")
    assert int8_kernels(path) == kernels


def test_the_cpu_is_named_from_the_first_processor(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(XEON_SPR, encoding="utf-8")
    assert cpu_name(path) == "Intel(R) Xeon(R) Platinum 8480+"
    assert "amx_int8" in cpu_flags(path) and "another" not in cpu_name(path)


def test_no_cpuinfo_still_names_something(tmp_path: Path) -> None:
    missing = tmp_path / "none"
    assert cpu_flags(missing) == frozenset()
    assert cpu_name(missing) and int8_kernels(missing)


def test_this_machine_has_a_known_class() -> None:
    """Linux x86-64 and Arm machines (what medrt runs and is measured on) all fall in one."""
    assert int8_kernels() in {"amx", "vnni", "avx512", "avx2", "arm-dot", "arm"}
    assert cpu_name() not in ("", "unknown CPU")


def test_cpu_layout_is_one_rule_for_every_command_and_ray_worker():
    from medrt.engine.hardware import cpu_layout, on_gpu

    assert cpu_layout(2, gpu=False) == (1, 2)  # a worker per core, one ORT thread each
    assert cpu_layout(16, gpu=False) == (4, 4)  # at most four workers, the cores shared out
    assert cpu_layout(0, gpu=False) == (1, 1)
    assert cpu_layout(16, gpu=True) == (None, 1)  # one worker feeds the device
    assert cpu_layout(8, gpu=False, workers=1, threads=3) == (3, 1)  # as asked
    assert on_gpu(device="cuda") and on_gpu("tensorrt") and on_gpu("torch") and not on_gpu("onnxruntime", "cpu")
