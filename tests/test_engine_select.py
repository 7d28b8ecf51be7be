"""Backend selection: the real probe on this machine, and constructed probes for GPU machines.

The constructed :class:`Probe` values are data describing a machine, not mocks:
the same selection code runs on them as on the real probe.
"""

from __future__ import annotations

import logging

import pytest

from medrt.engine.backends import BACKENDS
from medrt.engine.registry import ModelError
from medrt.engine.select import ALLOW_LIST, PREFERENCE, Choice, Combo, Probe, probe, rank, select

CPU_ONLY = Probe(ort_providers=("CPUExecutionProvider",))
H200_FULL = Probe(
    ort_providers=("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
    gpu_count=1, gpu_name="NVIDIA H200", gpu_capability=(9, 0),
    torch_version="2.11.0+cu130", torch_cuda=True, tensorrt_version="10.13.0",
)
TORCH_GPU = Probe(  # a CUDA machine with torch but neither TensorRT nor onnxruntime-gpu
    ort_providers=("CPUExecutionProvider",), gpu_count=1, gpu_name="NVIDIA H200", gpu_capability=(9, 0),
    torch_version="2.11.0+cu130", torch_cuda=True,
)
ORT_GPU = Probe(  # the `gpu` extra only: onnxruntime-gpu, no torch
    ort_providers=("CUDAExecutionProvider", "CPUExecutionProvider"), gpu_count=1, gpu_name="NVIDIA L4",
    gpu_capability=(8, 9),
)
ORT_TRT_GPU = Probe(ort_providers=H200_FULL.ort_providers, gpu_count=1, gpu_name="NVIDIA L4", gpu_capability=(8, 9))


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_real_probe_never_raises_and_sees_the_cpu() -> None:
    found = probe()
    assert "CPUExecutionProvider" in found.ort_providers
    assert isinstance(found.summary(), str)


def test_auto_picks_onnxruntime_cpu_here(caplog: pytest.LogCaptureFixture) -> None:
    found = probe()
    if found.cuda:
        pytest.skip("this machine has a CUDA device; the CPU-only expectation does not apply")
    caplog.set_level(logging.INFO)
    assert select(probe=found) == Choice("onnxruntime", "cpu", "fp32", None)
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("found", [CPU_ONLY, None], ids=["constructed", "real"])
def test_tensorrt_without_cuda_falls_back_with_one_warning(
    found: Probe | None, caplog: pytest.LogCaptureFixture
) -> None:
    found = found or probe()
    if found.cuda:
        pytest.skip("this machine has a CUDA device")
    caplog.set_level(logging.DEBUG)
    choice = select("tensorrt", probe=found)
    assert (choice.backend, choice.device, choice.precision) == ("onnxruntime", "cpu", "fp32")
    lines = warnings_of(caplog)
    assert len(lines) == 1, lines
    assert "TensorRT" in lines[0] and "onnxruntime" in lines[0] and "no CUDA device" in lines[0]
    assert lines[0] == "TensorRT requested but no CUDA device found; using onnxruntime on CPU (fp32)"


def test_fp16_on_cpu_falls_back_to_fp32(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    choice = select("auto", "cpu", "fp16", probe=CPU_ONLY)
    assert choice == Choice("onnxruntime", "cpu", "fp32", choice.fallback_reason)
    assert choice.fallback_reason and "fp16" in choice.fallback_reason
    (line,) = warnings_of(caplog)
    assert line.startswith("fp16 on CPU requested but") and line.endswith("using onnxruntime on CPU (fp32)")


def test_int8_on_cpu_onnxruntime_is_allowed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    assert select("onnxruntime", "cpu", "int8", probe=CPU_ONLY) == Choice("onnxruntime", "cpu", "int8")
    assert select("auto", "auto", "int8", probe=CPU_ONLY) == Choice("onnxruntime", "cpu", "int8")
    assert warnings_of(caplog) == []


@pytest.mark.parametrize(
    ("found", "precision", "expected"),
    [
        (H200_FULL, "fp16", ("tensorrt", "cuda", "fp16")),
        (H200_FULL, "int8", ("tensorrt", "cuda", "int8")),
        (TORCH_GPU, "fp16", ("torch", "cuda", "fp16")),
        (TORCH_GPU, "fp32", ("torch", "cuda", "fp32")),
        (ORT_GPU, "fp32", ("onnxruntime", "cuda", "fp32")),
        (ORT_TRT_GPU, "fp16", ("onnxruntime", "cuda", "fp16")),
        (CPU_ONLY, "fp32", ("onnxruntime", "cpu", "fp32")),
    ],
)
def test_auto_prefers_tensorrt_then_torch_then_ort_cuda_then_cpu(
    found: Probe, precision: str, expected: tuple[str, str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    assert select(precision=precision, probe=found) == Choice(*expected)
    assert warnings_of(caplog) == []


def test_gpu_fallbacks_name_the_request_and_the_result(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    # TensorRT asked for on a machine with torch CUDA but no TensorRT: torch keeps the GPU and fp16.
    choice = select("tensorrt", precision="fp16", probe=TORCH_GPU)
    assert (choice.backend, choice.device, choice.precision) == ("torch", "cuda", "fp16")
    assert "tensorrt package is not importable" in (choice.fallback_reason or "")
    # int8 is not tested on torch: the precision falls back, the backend stays.
    choice = select("torch", precision="int8", probe=TORCH_GPU)
    assert (choice.backend, choice.precision) == ("torch", "fp32")
    # fp16 through onnxruntime needs its TensorRT provider; CUDA alone gives fp32.
    choice = select("onnxruntime", "cuda", "fp16", probe=ORT_GPU)
    assert (choice.backend, choice.device, choice.precision) == ("onnxruntime", "cuda", "fp32")
    lines = warnings_of(caplog)
    assert len(lines) == 3
    assert lines[0].startswith("TensorRT (fp16) requested but") and lines[0].endswith("using torch on CUDA (fp16)")


def test_a_pair_that_never_runs_keeps_the_backend_where_it_can() -> None:
    choice = select("tensorrt", "cpu", probe=H200_FULL)
    assert (choice.backend, choice.device) == ("tensorrt", "cuda")
    assert "does not run on CPU" in (choice.fallback_reason or "")
    choice = select("torch", "cpu", probe=CPU_ONLY)
    assert (choice.backend, choice.device) == ("onnxruntime", "cpu")


def test_every_allow_list_entry_is_reachable() -> None:
    machines = [H200_FULL, TORCH_GPU, ORT_GPU, ORT_TRT_GPU, CPU_ONLY]
    reached = set()
    for combo in ALLOW_LIST:
        for found in machines:
            choice = select(*combo, probe=found)
            if choice.fallback_reason is None:
                assert (choice.backend, choice.device, choice.precision) == combo
                reached.add(combo)
                break
    assert reached == set(ALLOW_LIST)
    assert {(b, d) for b, d, _ in ALLOW_LIST} == set(PREFERENCE)


def test_probe_supports_and_named_allow_list_keys() -> None:
    assert all(isinstance(c, Combo) and c.backend in BACKENDS for c in ALLOW_LIST)
    assert H200_FULL.supports("tensorrt", "cuda") and not CPU_ONLY.supports("tensorrt", "cuda")
    assert CPU_ONLY.supports("onnxruntime", "cpu", "int8") and not CPU_ONLY.supports("onnxruntime", "cpu", "fp16")
    assert ORT_GPU.supports("onnxruntime", "cuda") and not ORT_GPU.supports("onnxruntime", "cuda", "fp16")


def test_rank_lists_every_runnable_choice_best_first() -> None:
    choices = rank(found=H200_FULL)
    assert [(c.backend, c.device) for c in choices] == list(PREFERENCE)
    assert all(c.fallback_reason is None for c in choices)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ModelError, match='"backend"'):
        select("tflite", probe=CPU_ONLY)
    with pytest.raises(ModelError, match='"device"'):
        select(device="tpu", probe=CPU_ONLY)
    with pytest.raises(ModelError, match='"precision"'):
        select(precision="bf16", probe=CPU_ONLY)


def test_no_runtime_at_all_is_a_clear_error() -> None:
    with pytest.raises(ModelError, match="no backend can run here"):
        select(probe=Probe())
