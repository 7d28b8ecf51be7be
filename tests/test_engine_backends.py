"""Backends: ONNX Runtime IO binding, the registry, the TensorRT cache key, torch and TensorRT.

The ONNX Runtime and cache tests run everywhere. The torch backend's logic runs
here on the CPU (``device="cpu"``) against ONNX Runtime on randomly initialised
shipped architectures. Tests marked ``gpu`` run the shipped ``lesion_unet`` on
CUDA (torch, TensorRT) and skip without a CUDA GPU.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import require_module
from medrt.bands import usable_cores
from medrt.engine import cache
from medrt.engine.backends import BACKENDS, create
from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
from medrt.engine.backends.tensorrt import TensorRTBackend
from medrt.engine.backends.torch_cuda import TorchCudaBackend
from medrt.engine.registry import ModelError, ModelSpec, find_spec, load_spec, sha256_file
from medrt.engine.select import Probe, create_backend

SPEC = """[model]
name = "{name}"
version = "0.0.1"
task = "segmentation"
file = "{name}.onnx"
sha256 = "{sha}"
multiple_of = 16

[[inputs]]
name = "image"
shape = [1, 1, "H", "W"]

[[outputs]]
name = "presence"
shape = [1, 1]

[[outputs]]
name = "logits"
shape = [1, 1, "H", "W"]
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    """A 3×3 convolution with dynamic H/W, and a max-pooled second output. The spec lists
    the outputs in the opposite order to the graph, so the order test can fail."""
    folder = tmp_path_factory.mktemp("tiny")
    weight = np.random.default_rng(0).standard_normal((1, 1, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["image", "w"], ["logits"], pads=[1, 1, 1, 1]),
            helper.make_node("GlobalMaxPool", ["logits"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["presence"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 1, "H", "W"])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, "H", "W"]),
            helper.make_tensor_value_info("presence", TensorProto.FLOAT, [1, 1]),
        ],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, folder / "tiny.onnx")
    (folder / "tiny.toml").write_text(SPEC.format(name="tiny", sha=sha256_file(folder / "tiny.onnx")))
    return load_spec(folder / "tiny.toml")


def _x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(shape, dtype=np.float32)


# ---- ONNX Runtime ------------------------------------------------------------------------
def test_io_binding_equals_session_run(tiny: ModelSpec) -> None:
    backend = OnnxRuntimeBackend(tiny)
    for i, shape in enumerate([(1, 1, 32, 32), (1, 1, 48, 64), (1, 1, 32, 32), (1, 1, 48, 64)]):
        x = _x(shape, seed=i)
        want = backend.session.run(["presence", "logits"], {"image": x})
        got = backend.infer(x)
        assert [g.shape for g in got] == [(1, 1), shape]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
    assert len(backend._bound) == 2  # one binding per input shape, reused


def test_outputs_are_fresh_unless_reuse_outputs(tiny: ModelSpec) -> None:
    backend = OnnxRuntimeBackend(tiny)
    first = backend.infer(_x((1, 1, 32, 32), 1))
    kept = [a.copy() for a in first]
    second = backend.infer(_x((1, 1, 32, 32), 2))
    third = backend.infer(_x((1, 1, 32, 32), 3))
    for a, b, c, k in zip(first, second, third, kept, strict=True):
        np.testing.assert_array_equal(a, k)  # later calls did not overwrite what the caller kept
        assert not np.shares_memory(a, b) and not np.shares_memory(b, c)
    assert not np.array_equal(second[1], third[1])

    reusing = OnnxRuntimeBackend(tiny, reuse_outputs=True)
    a = reusing.infer(_x((1, 1, 32, 32), 1))
    b = reusing.infer(_x((1, 1, 32, 32), 2))
    assert all(np.shares_memory(p, q) for p, q in zip(a, b, strict=True))  # the documented reuse
    np.testing.assert_array_equal(b[1], second[1])


def test_threads_share_a_session_without_sharing_bindings(tiny: ModelSpec) -> None:
    """Pipeline workers call one backend at once: each thread gets its own binding and
    buffers (no lock to take turns on), and every result equals the serial one."""
    backend = OnnxRuntimeBackend(tiny, reuse_outputs=True)
    inputs = [_x((1, 1, 32, 32), i) for i in range(16)]
    want = [[a.copy() for a in backend.infer(x)] for x in inputs]
    start = threading.Barrier(4)
    got: dict[int, list[list[np.ndarray]]] = {}
    bindings: dict[int, object] = {}

    def work(k: int) -> None:
        start.wait()
        got[k] = [[a.copy() for a in backend.infer(x)] for x in inputs]
        bindings[k] = backend._bound[(1, 1, 32, 32)][0]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(4):
        for g, w in zip(got[k], want, strict=True):
            for a, b in zip(g, w, strict=True):
                np.testing.assert_array_equal(a, b)
    assert len({id(b) for b in bindings.values()}) == 4
    assert not hasattr(backend, "_lock")


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        return int(fh.read().split("VmRSS:")[1].split()[0]) / 1024


def test_cpu_sessions_share_one_arena_and_answer_as_with_their_own() -> None:
    """Each CPU session kept an arena of its own, grown to its peak and never given back, so
    the listener's models held about 330 MB more than one shared arena needs. Now sessions
    take their buffers from the process's one arena (``session.use_env_allocators``): three
    more sessions running a 768² frame, once the arena has seen it, take next to nothing more,
    where three with arenas of their own take one peak each (~45 MB here); same outputs."""
    spec = find_spec("lesion_unet_lite")
    x = np.random.default_rng(0).standard_normal((1, spec.inputs[0].shape[1], 768, 768), dtype=np.float32)
    first = OnnxRuntimeBackend(spec, threads=1)
    assert first.shared_arena
    assert first.session.get_session_options().get_session_config_entry("session.use_env_allocators") == "1"
    reference = first.infer(x)[0]  # the shared arena has now seen this shape
    held = [first]

    def growth(shared: bool) -> float:
        sessions = [OnnxRuntimeBackend(spec, threads=1, shared_arena=shared) for _ in range(3)]
        held.extend(sessions)  # kept alive: an arena is given back only with its session
        before = _rss_mb()
        for session in sessions:
            assert np.array_equal(session.infer(x)[0], reference)
        return _rss_mb() - before

    own, shared = growth(False), growth(True)
    assert own > 60, own  # the measure sees an arena's peak
    assert shared < own / 3, (shared, own)


def test_cpu_sessions_run_without_ort_memory_pattern_unless_asked(tiny: ModelSpec) -> None:
    """ORT's memory pattern (a shape's later runs take their buffers as one block planned on
    its first) grew the arena again on a second pass over many frame sizes (+173 MB against
    +11 over 30 sizes) and held more on one shape, at no speed measurable here
    (benchmarks/ort_mem_pattern.py). A CPU session is made without it; ``mem_pattern=True``
    (also through the analyzer's ``backend_options``) brings it back."""
    def enabled(backend: OnnxRuntimeBackend) -> bool:
        return backend.session.get_session_options().enable_mem_pattern

    default = OnnxRuntimeBackend(tiny)
    assert default.mem_pattern is False and not enabled(default)
    assert enabled(OnnxRuntimeBackend(tiny, mem_pattern=True))
    assert not enabled(OnnxRuntimeBackend(tiny, mem_pattern=False, shared_arena=False))
    chosen = create_backend(tiny, "onnxruntime", "cpu", options={"onnxruntime": {"mem_pattern": True}})
    assert isinstance(chosen, OnnxRuntimeBackend) and enabled(chosen)


def test_outputs_are_the_same_with_and_without_ort_memory_pattern() -> None:
    """The memory pattern changes where a run's buffers lie, not what it computes: the
    segmenters answer bit for bit the same with it and without it, over several shapes, on
    each shape's first run (planned) and later ones (the pattern used where it is on)."""
    rng = np.random.default_rng(5)
    for name, shapes in (("lesion_unet_lite", [(512, 512), (96, 160), (512, 512)]),
                         ("lesion_unet", [(128, 96), (256, 256), (128, 96), (256, 256)])):
        on = OnnxRuntimeBackend(find_spec(name), threads=1, mem_pattern=True)
        off = OnnxRuntimeBackend(find_spec(name), threads=1)
        assert on.session.get_session_options().enable_mem_pattern and not off.mem_pattern
        for hw in shapes:
            x = rng.standard_normal((1, on.spec.inputs[0].shape[1], *hw), dtype=np.float32)
            for _ in range(2):
                for a, b in zip(on.infer(x), off.infer(x), strict=True):
                    np.testing.assert_array_equal(a, b)


def test_sessions_in_the_one_arena_run_at_once_and_answer_as_with_their_own() -> None:
    """The pipeline's workers, the listener beside the viewer: sessions of different models
    and shapes run at once from several threads, one of them from two threads at once, and
    all take their buffers from the one arena (ORT's BFC arena allocates, frees and shrinks
    under its own lock). Every output equals, bit for bit, that of a session with an arena
    of its own run alone; a shrink requested by one run while the others run changes none."""
    import onnxruntime as ort

    jobs = [("roi_classifier", (256, 256)), ("lesion_unet", (160, 224)), ("lesion_unet", (96, 128)),
            ("lesion_unet_lite", (192, 256))]
    shared = {name: OnnxRuntimeBackend(find_spec(name), threads=1) for name, _ in jobs}
    assert all(b.shared_arena for b in shared.values())
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, shared[name].spec.inputs[0].shape[1], *hw), dtype=np.float32) for name, hw in jobs]
    want = [OnnxRuntimeBackend(find_spec(name), threads=1, shared_arena=False).infer(x)
            for (name, _), x in zip(jobs, xs, strict=True)]
    shrink = ort.RunOptions()
    shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    start = threading.Barrier(len(jobs) + 1)
    wrong: list[tuple[str, int]] = []

    def work(k: int) -> None:
        backend = shared[jobs[k][0]]
        start.wait()
        for r in range(6):
            if not all(np.array_equal(a, b) for a, b in zip(backend.infer(xs[k]), want[k], strict=True)):
                wrong.append((jobs[k][0], r))

    def shrinking() -> None:  # a run that gives the arena's free regions back, among the others
        backend = shared["lesion_unet_lite"]
        start.wait()
        for _ in range(3):
            got = backend.session.run(backend.output_names, {backend.input_name: xs[3]}, shrink)
            if not all(np.array_equal(a, b) for a, b in zip(got, want[3], strict=True)):
                wrong.append(("shrinking", 0))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(jobs))]
    threads.append(threading.Thread(target=shrinking))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong


def test_plain_run_mode_matches(tiny: ModelSpec) -> None:
    x = _x((1, 1, 40, 24))
    got = OnnxRuntimeBackend(tiny, io_binding=False).infer(x)
    want = OnnxRuntimeBackend(tiny).infer(x)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_threads_and_precision_are_reported(tiny: ModelSpec) -> None:
    # (precision="int8" swaps in the gated INT8 twin: test_engine_quantize covers it)
    backend = OnnxRuntimeBackend(tiny)
    info = backend.info()
    assert (info.backend, info.device, info.precision, info.threads) == ("onnxruntime", "cpu", "fp32", usable_cores())
    opts = backend.session.get_session_options()
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (usable_cores(), 1)


def test_unavailable_provider_is_a_clear_error(tiny: ModelSpec) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    with pytest.raises(ModelError, match=r"no CUDAExecutionProvider .*onnxruntime-gpu"):
        OnnxRuntimeBackend(tiny, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(ModelError, match="CUDAExecutionProvider"):
        OnnxRuntimeBackend(tiny, device="cuda")
    with pytest.raises(ModelError, match="not fp16"):
        OnnxRuntimeBackend(tiny, precision="fp16")
    with pytest.raises(ModelError, match='"precision"'):
        OnnxRuntimeBackend(tiny, precision="bf16")


# ---- registry and import hygiene ---------------------------------------------------------
def test_registry_is_a_read_only_table(tiny: ModelSpec) -> None:
    assert set(BACKENDS) == {"onnxruntime", "tensorrt", "torch"}
    with pytest.raises(TypeError):
        BACKENDS["mine"] = "x:y"  # type: ignore[index]
    assert isinstance(create("onnxruntime", tiny), OnnxRuntimeBackend)
    with pytest.raises(ModelError, match="no backend named 'tflite'"):
        create("tflite", tiny)


def test_backend_modules_import_no_runtime() -> None:
    code = (
        "import sys, medrt, medrt.engine.select, medrt.engine.cache\n"
        "import medrt.engine.backends.onnxrt, medrt.engine.backends.tensorrt, medrt.engine.backends.torch_cuda\n"
        "bad = [m for m in ('torch', 'tensorrt', 'onnxruntime', 'PySide6') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- selection + registry: create_backend ------------------------------------------------
def test_create_backend_selects_loads_and_warms_up(tiny: ModelSpec, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    backend = create_backend(
        tiny, probe=Probe(ort_providers=("CPUExecutionProvider",)), warmup_shapes=[(32, 32)],
        reuse_outputs=True, options={"torch": {"cuda_graph": True}},
    )
    assert isinstance(backend, OnnxRuntimeBackend) and backend.reuse_outputs
    assert list(backend._bound) == [(1, 1, 32, 32)]  # warmed up: the binding exists before frame 1
    assert caplog.records == []


def test_auto_tries_the_next_backend_when_one_cannot_load(tiny: ModelSpec, caplog: pytest.LogCaptureFixture) -> None:
    torch = require_module("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    # A machine description that promises torch CUDA; here the torch backend then fails to load.
    promised = Probe(ort_providers=("CPUExecutionProvider",), gpu_count=1, gpu_name="NVIDIA H200",
                     gpu_capability=(9, 0), torch_version=torch.__version__, torch_cuda=True)
    caplog.set_level(logging.WARNING)
    assert isinstance(create_backend(tiny, probe=promised), OnnxRuntimeBackend)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("torch on CUDA (fp32) could not load tiny@0.0.1") and line.endswith(
        "trying onnxruntime on CPU (fp32)"
    )
    with pytest.raises(ModelError, match="no CUDA device"):  # asked for by name: no silent swap
        create_backend(tiny, "torch", probe=promised)


# ---- torch and TensorRT without a GPU ----------------------------------------------------
def test_gpu_backends_without_cuda_are_clear_errors(tiny: ModelSpec) -> None:
    torch = require_module("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ModelError, match="no CUDA device"):
        TorchCudaBackend(tiny)
    with pytest.raises(ModelError, match="no CUDA device"):
        create("torch", tiny, device="cuda", precision="fp16")
    with pytest.raises(ModelError, match="no CUDA device"):
        TensorRTBackend(tiny, precision="fp16")


def test_torch_backend_needs_weights_and_a_definition(tiny: ModelSpec, tmp_path: Path) -> None:
    require_module("torch")
    with pytest.raises(ModelError, match=r"torch weights not found .*tiny\.pt"):
        TorchCudaBackend(tiny, device="cpu")
    (tmp_path / "tiny.pt").write_bytes(b"")
    with pytest.raises(ModelError, match="no torch network definition"):
        TorchCudaBackend(tiny, device="cpu", weights=tmp_path / "tiny.pt")


@pytest.fixture(scope="module")
def random_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelSpec]:
    """The shipped architectures with random weights, exported and specified like the shipped
    ones (by models/train.py's own export and spec writer)."""
    require_module("monai")
    torch = require_module("torch")
    from medrt.models import train
    from medrt.models.networks import RoiNet, build_unet

    folder = tmp_path_factory.mktemp("random_models")
    out = {}
    for name, net in (("roi_classifier", RoiNet()), ("lesion_unet_lite", build_unet("lesion_unet_lite"))):
        torch.manual_seed(0)
        net = net.eval()
        torch.save(net.state_dict(), folder / f"{name}.pt")
        onnx_path = train.export(net, name, folder, name == "roi_classifier")
        out[name] = load_spec(_write_spec(onnx_path, name))
    return out


def _write_spec(onnx_path: Path, name: str) -> Path:
    roi = name == "roi_classifier"
    outputs = [("presence", [1, 1]), ("heatmap", [1, 1, "h", "w"])] if roi else [("logits", [1, 1, "H", "W"])]
    lines = [
        "[model]", f'name = "{name}"', 'version = "0.0.0"',
        f'task = "{"roi_classifier" if roi else "segmentation"}"', f'file = "{onnx_path.name}"',
        f'sha256 = "{sha256_file(onnx_path)}"', f"multiple_of = {8 if roi else 16}",
        *(["thumbnail = 512", "stride = 8"] if roi else []),
        "[[inputs]]", 'name = "image"', 'shape = [1, 1, "H", "W"]',
    ]
    for out_name, shape in outputs:
        lines += ["[[outputs]]", f'name = "{out_name}"', f"shape = {json.dumps(shape)}"]
    path = onnx_path.with_suffix(".toml")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")
@pytest.mark.filterwarnings("ignore:The feature will be removed")
@pytest.mark.parametrize("name", ["roi_classifier", "lesion_unet_lite"])
def test_torch_backend_logic_on_cpu_matches_onnxruntime(name: str, random_models: dict[str, ModelSpec]) -> None:
    spec = random_models[name]
    ort_backend = OnnxRuntimeBackend(spec)
    torch_backend = TorchCudaBackend(spec, device="cpu")
    assert torch_backend.info().precision == "fp32" and torch_backend.vram_bytes == 0
    for shape in [(1, 1, 64, 64), (1, 1, 96, 64), (1, 1, 64, 64)]:
        x = _x(shape)
        want, got = ort_backend.infer(x), torch_backend.infer(x)
        assert [g.shape for g in got] == [w.shape for w in want]
        assert all(g.dtype == np.float32 for g in got)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)
    kept = [g.copy() for g in got]
    torch_backend.infer(_x((1, 1, 64, 64), seed=5))
    for g, k in zip(got, kept, strict=True):
        np.testing.assert_array_equal(g, k)  # returned arrays are the caller's
    # A batch (the fine sweep's flipped views go as one, up to max_batch) gives each
    # input's own answer: onnxruntime's, whose graph takes one at a time.
    assert torch_backend.max_batch > 1 and ort_backend.max_batch == 1 and not torch_backend.few_shapes
    xs = [_x((1, 1, 64, 96), seed=k) for k in (1, 2, 3)]
    batch = torch_backend.infer(np.concatenate(xs))
    for k, x in enumerate(xs):
        for g, w in zip(batch, ort_backend.infer(x), strict=True):
            np.testing.assert_allclose(g[k : k + 1], w, atol=1e-4, rtol=1e-4)


# ---- TensorRT engine cache ---------------------------------------------------------------
PROFILE = (("image", (1, 1, 32, 32), (1, 1, 1024, 1024), (1, 1, 2048, 2048)),)
BASE = cache.EngineKey("ab" * 32, "10.13.0", "NVIDIA H200", "9.0", "fp16", PROFILE, True)
CHANGES = {
    "onnx_sha256": "cd" * 32,
    "tensorrt_version": "10.14.1",
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "compute_capability": "8.9",
    "precision": "int8",
    "profile": (("image", (1, 1, 32, 32), (1, 1, 512, 512), (1, 1, 2048, 2048)),),
    "keep_io_layers_fp32": False,
}


def test_cache_key_changes_with_each_field_and_is_stable_otherwise() -> None:
    assert set(CHANGES) == {f.name for f in dataclasses.fields(cache.EngineKey)}
    digests = {BASE.digest}
    for field, value in CHANGES.items():
        digests.add(dataclasses.replace(BASE, **{field: value}).digest)
    assert len(digests) == 1 + len(CHANGES)
    same = cache.EngineKey(**{f.name: getattr(BASE, f.name) for f in dataclasses.fields(cache.EngineKey)})
    assert same.digest == BASE.digest and len(BASE.digest) == 64


def test_staleness_names_the_mismatched_fields(tmp_path: Path) -> None:
    engine, sidecar = cache.engine_files(BASE, tmp_path)
    cache.write_engine(engine, b"not really an engine", BASE)
    assert engine.read_bytes() == b"not really an engine"
    assert cache.stale_fields(sidecar, BASE) == {}
    now = dataclasses.replace(BASE, precision="fp32", gpu_name="NVIDIA L4")
    mismatch = cache.stale_fields(sidecar, now)
    assert set(mismatch) == {"precision", "gpu_name"}
    line = cache.describe_stale(mismatch)
    assert "precision: engine 'fp16', now 'fp32'" in line and "gpu_name: engine 'NVIDIA H200'" in line


@pytest.mark.parametrize("content", [None, b"", b"{not json", b"[1, 2]", b'{"fields": 3}', b"\xff\xfe"])
def test_a_missing_or_corrupted_sidecar_is_stale(tmp_path: Path, content: bytes | None) -> None:
    sidecar = tmp_path / "x.json"
    if content is not None:
        sidecar.write_bytes(content)
    assert set(cache.stale_fields(sidecar, BASE)) == {"sidecar"}


def test_a_sidecar_with_a_missing_field_is_stale(tmp_path: Path) -> None:
    sidecar = tmp_path / "x.json"
    fields = BASE.fields()
    del fields["profile"]
    sidecar.write_text(json.dumps({"key": BASE.digest, "fields": fields}))
    assert set(cache.stale_fields(sidecar, BASE)) == {"profile"}


def test_an_engine_built_under_the_old_fp32_layer_rule_is_stale(tmp_path: Path) -> None:
    """keep_io_layers_fp32 used to cover the first and last convolutions only; it now
    covers the front before the first one too, so an engine cached under the old rule
    (sidecar value ``true``) must be rebuilt, not reused."""
    engine, sidecar = cache.engine_files(BASE, tmp_path)
    cache.write_engine(engine, b"engine", BASE)
    doc = json.loads(sidecar.read_text())
    doc["fields"]["keep_io_layers_fp32"] = True
    sidecar.write_text(json.dumps(doc))
    assert set(cache.stale_fields(sidecar, BASE)) == {"keep_io_layers_fp32"}


def test_fp32_layers_cover_the_front_and_the_last_convolution() -> None:
    """Which layers a reduced-precision engine keeps in float32, on the layer list of a
    network shaped like the shipped UNets: shape arithmetic (int outputs) is left to
    TensorRT; the pooling/tanh front, the first and the last convolution are kept.
    (TensorRT cannot run here: its layer and tensor objects are stood in for.)"""
    from types import SimpleNamespace as NS

    from medrt.engine.backends.tensorrt import fp32_layers

    trt = NS(float32="f32", float16="f16", int64="i64",
             LayerType=NS(CONVOLUTION="conv", POOLING="pool", ACTIVATION="act", SHAPE="shape", ELEMENTWISE="ew"))

    def layer(name: str, kind: str, dtype: str = "f32") -> NS:
        return NS(name=name, type=kind, num_outputs=1, get_output=lambda _i: NS(dtype=dtype))

    layers = [layer("pool_h", "pool"), layer("shape", "shape", "i64"), layer("pool_v", "pool"),
              layer("sub", "ew"), layer("tanh", "act"), layer("conv_first", "conv"), layer("relu", "act"),
              layer("conv_mid", "conv"), layer("conv_last", "conv"), layer("out_act", "act")]
    names = [x.name for x in fp32_layers(trt, layers)]
    assert names == ["pool_h", "pool_v", "sub", "tanh", "conv_first", "conv_last"]
    assert [x.name for x in fp32_layers(trt, [layer("conv", "conv")])] == ["conv"]
    assert fp32_layers(trt, [layer("pool", "pool")]) == []


def _deserialize(data: bytes) -> bytes | None:
    """Stands in for TensorRT's runtime: accepts only bytes that start like an engine."""
    return data if data.startswith(b"ENGINE:") else None


def test_get_or_build_builds_once_then_loads(tmp_path: Path) -> None:
    builds: list[int] = []

    def build() -> bytes:
        builds.append(1)
        return b"ENGINE:one"

    engine, sidecar = cache.engine_files(BASE, tmp_path)
    assert cache.get_or_build(engine, BASE, _deserialize, build) == b"ENGINE:one"
    assert cache.get_or_build(engine, BASE, _deserialize, build) == b"ENGINE:one"
    assert builds == [1] and cache.stale_fields(sidecar, BASE) == {}


def test_a_stale_engine_is_refused_or_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = tmp_path / "pinned.engine"
    cache.write_engine(engine, b"ENGINE:old", dataclasses.replace(BASE, tensorrt_version="10.0.1"))
    with pytest.raises(ModelError, match="tensorrt_version: engine '10.0.1', now '10.13.0'"):
        cache.get_or_build(engine, BASE, _deserialize, lambda: b"ENGINE:new", rebuild_stale=False)
    assert engine.read_bytes() == b"ENGINE:old"
    caplog.set_level(logging.WARNING)
    assert cache.get_or_build(engine, BASE, _deserialize, lambda: b"ENGINE:new") == b"ENGINE:new"
    (line,) = [r.getMessage() for r in caplog.records]
    assert "rebuilding stale" in line and "tensorrt_version" in line
    assert cache.stale_fields(cache.sidecar_for(engine), BASE) == {}


def test_an_engine_that_does_not_deserialize_is_stale(tmp_path: Path) -> None:
    engine, _ = cache.engine_files(BASE, tmp_path)
    cache.write_engine(engine, b"truncated", BASE)
    with pytest.raises(ModelError, match="engine: engine 'does not deserialize'"):
        cache.get_or_build(engine, BASE, _deserialize, lambda: b"ENGINE:new", rebuild_stale=False)

    def refuse(data: bytes) -> bytes:
        raise RuntimeError("bad magic tag")

    with pytest.raises(ModelError, match="bad magic tag"):
        cache.get_or_build(engine, BASE, refuse, lambda: b"ENGINE:new", rebuild_stale=False)
    assert cache.get_or_build(engine, BASE, _deserialize, lambda: b"ENGINE:new") == b"ENGINE:new"


def test_cache_dir_follows_medrt_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MEDRT_CACHE", str(tmp_path))
    assert cache.engine_files(BASE) == (tmp_path / "trt" / f"{BASE.digest}.engine", tmp_path / "trt" / f"{BASE.digest}.json")
    monkeypatch.delenv("MEDRT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "medrt" / "trt"


def test_default_profiles(tiny: ModelSpec) -> None:
    assert cache.default_profile(tiny) == (("image", (1, 1, 32, 32), (1, 1, 1024, 1024), (1, 1, 2048, 2048)),)
    roi = dataclasses.replace(tiny, task="roi_classifier", thumbnail=500, stride=8, multiple_of=8)
    assert cache.default_profile(roi) == (("image", (1, 1, 32, 32), (1, 1, 504, 504), (1, 1, 504, 504)),)
    with pytest.raises(ModelError, match="outside"):
        cache.default_profile(tiny, opt=(4096, 4096))


# ---- on a CUDA GPU -----------------------------------------------------------------------
def _cuda_or_skip():  # type: ignore[no-untyped-def]
    try:
        import torch
    except ImportError:
        pytest.skip("no CUDA GPU (torch is not installed)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return torch


def _prob(a: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-a.astype(np.float64)))


@pytest.mark.gpu
def test_torch_cuda_runs_the_shipped_lesion_unet() -> None:
    _cuda_or_skip()
    spec = find_spec("lesion_unet")
    x = _x((1, 1, 256, 256))
    want = _prob(OnnxRuntimeBackend(spec).infer(x)[0])
    for precision, graph, atol in (("fp32", False, 5e-3), ("fp32", True, 5e-3), ("fp16", True, 3e-2)):
        backend = TorchCudaBackend(spec, precision=precision, cuda_graph=graph)
        assert backend.vram_bytes > 0
        for _ in range(2):
            got = backend.infer(x)[0]
            assert got.dtype == np.float32 and got.shape == (1, 1, 256, 256)
            np.testing.assert_allclose(_prob(got), want, atol=atol)
        assert backend.graphs == (1 if graph else 0)


@pytest.mark.gpu
def test_tensorrt_builds_caches_and_checks_the_shipped_lesion_unet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _cuda_or_skip()
    if sys.modules.get("tensorrt") is None:
        try:
            import tensorrt  # noqa: F401
        except Exception:
            pytest.skip("no TensorRT on this CUDA machine")
    spec = find_spec("lesion_unet")
    profile = {"image": ((1, 1, 64, 64), (1, 1, 256, 256), (1, 1, 512, 512))}
    x = _x((1, 1, 256, 256))
    want = _prob(OnnxRuntimeBackend(spec).infer(x)[0])
    built = TensorRTBackend(spec, precision="fp16", profile=profile, cache_folder=tmp_path)
    np.testing.assert_allclose(_prob(built.infer(x)[0]), want, atol=3e-2)
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".engine", ".json"]
    caplog.set_level(logging.INFO)
    cached = TensorRTBackend(spec, precision="fp16", profile=profile, cache_folder=tmp_path)
    assert any("from cache" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(cached.infer(x)[0], built.infer(x)[0], atol=1e-3)
    # A pinned engine whose sidecar says another precision is stale, and named so.
    pinned = tmp_path / "pinned" / "unet.engine"
    pinned.parent.mkdir()
    pinned.write_bytes(built.engine_path.read_bytes())
    doc = json.loads(built.engine_path.with_suffix(".json").read_text())
    doc["fields"]["precision"] = "fp32"
    pinned.with_suffix(".json").write_text(json.dumps(doc))
    with pytest.raises(ModelError, match="precision: engine 'fp32', now 'fp16'"):
        TensorRTBackend(spec, precision="fp16", profile=profile, engine_path=pinned, rebuild_stale=False)


def test_analysing_imports_neither_the_phantom_generators_nor_torch_on_a_cpu_server() -> None:
    """A batch, listener or viewer process imports the modules below and creates its backends
    through the probe. The lesion diameters (``medrt.phantom.shapes``) and the INT8 gate's
    ground truth ran ``medrt/phantom/__init__`` and with it the generators and SimpleITK
    (~145 MB); and on a machine without the NVIDIA driver the probe imported torch (~300 MB,
    seconds) to ask for a CUDA device that cannot be there. ``medrt.phantom``'s names still
    import when used."""
    import ctypes

    for library in ("libnvidia-ml.so.1", "libcuda.so.1"):
        try:
            ctypes.CDLL(library)
        except OSError:
            continue
        pytest.skip(f"{library} loads here: the probe asks torch, as it should where a driver is")
    code = (
        "import sys\n"
        "import medrt.batch.run, medrt.pacs.service, medrt.analyzer, medrt.engine.gate, medrt.commands.eval\n"
        "from medrt.analysis.lesions import lesions_from_probability\n"
        "from medrt.engine.select import probe\n"
        "found = probe()\n"
        "bad = [m for m in ('SimpleITK', 'medrt.phantom.ct', 'medrt.phantom.xray', 'torch', 'tensorrt')"
        " if m in sys.modules]\n"
        "assert not bad, bad\n"
        "assert found.gpu_count == 0 and not found.cuda, found\n"
        "import medrt.phantom\n"
        "assert callable(medrt.phantom.generate_ct_series) and 'SimpleITK' in sys.modules\n"
        "assert 'write_radiographs' in dir(medrt.phantom)\n"
        "try:\n"
        "    medrt.phantom.nothing\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('medrt.phantom.nothing')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
