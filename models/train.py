"""Train a shipped model on phantoms, export it to ONNX and write its spec.

    python -m medrt.models.train lesion_unet --steps 80000 --minutes 26 --data all \
        --lesion-start 0.7 --lesion-end 0.35 --amp bf16 --crop 192 --out models
    python -m medrt.models.train lesion_unet_lite --steps 80000 --minutes 16 --data ct \
        --lesion-start 0.7 --lesion-end 0.35 --amp bf16 --crop 192 --out models
    python -m medrt.models.train lesion_unet_dx --steps 80000 --minutes 28 --data dx \
        --lesion-start 0.9 --lesion-end 0.5 --amp bf16 --crop 192 --out models
    python -m medrt.models.train roi_classifier --steps 2500 --data ct --out models
    python -m medrt.models.train lesion_unet --export-only   # re-export the shipped .pt

(the shipped models' exact commands are in their specs, ``[training] command``;
``--amp bf16`` needs a CPU with BF16 kernels and is refused elsewhere, see
:func:`native_bf16`; the ROI classifier trains in fp32: a bf16 run of it diverged).

Needs the ``train`` extra (torch, MONAI, onnx). Runs on the CPU. The phantom
data is generated once into ``--cache`` (deterministic, rebuildable;
``--build-only`` makes it and stops). The export replaces PRelu, ConvTranspose
and one-channel pooling by exact equivalents ONNX Runtime runs faster and in INT8
(``medrt.engine.rewrite``) and checks the ONNX output against torch. Segmentation patches are made at the
UNets' pixel spacing (``data.SEG_SPACING``, written to the spec as
``spacing_mm``). This CPU is shared, so ``--minutes`` bounds a run by time (the
schedule follows it) and the spec records the steps it reached.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from medrt.engine.registry import sha256_file
from medrt.models import data as phantom_data
from medrt.models.networks import (
    EDGE_CHANNEL,
    UNET_VARIANTS,
    WIDE_WINDOW,
    RoiNet,
    build_unet,
    network_for,
)

log = logging.getLogger("medrt.models.train")

# The version this script writes per model: the minor goes up with the recipe (2.1:
# bf16 steps, the radiograph window jitter), the major with the network or its inputs.
VERSIONS = {"lesion_unet": "2.2.0", "lesion_unet_dx": "1.1.0", "lesion_unet_lite": "3.0.0", "roi_classifier": "1.1.0", "roi_classifier_dx": "1.1.0"}
ROI_MODELS = phantom_data.ROI_MODELS
TWO_WINDOWS_NOTE = ("; CT comes in one wide window, and the graph cuts the soft-tissue window (40/400) from it and"
                    " keeps the wide one beside it (models/networks.py TwoWindows)")
# The DICOM Modality values each --data choice trains for (the phantoms' CT and DX; CR
# radiographs are the same picture from a storage-phosphor plate).
MODALITIES = {"all": ("CT", "DX", "CR"), "ct": ("CT",), "dx": ("DX", "CR")}
# A model trained on the phantom's chest radiographs (PA) only: which radiographs it takes
# ([model] body_parts / views; a header that names none is taken too). "all" models take
# CT as well, whose BodyPartExamined they do not restrict. A CT-only model learnt axial
# slices, and takes no coronal or sagittal reformat ([model] planes).
BODY_PARTS = {"dx": ("CHEST", "THORAX", "LUNG")}
VIEWS = {"dx": ("PA", "AP")}
EXPORT_NOTE = ("torch.onnx (TorchScript exporter), then medrt.engine.rewrite.cpu_friendly: PRelu as LeakyRelu, "
               "ConvTranspose as Conv + pixel shuffle (DepthToSpace for one output channel), one-channel box "
               "pooling with rows as channels (exact; checked against torch)")
ENSEMBLE_NOTE = "{n} members in one graph, their logits averaged (python -m medrt.models.ensemble)"
OPSET = 17


def _data(args: argparse.Namespace, part: str) -> tuple[phantom_data.RoiData | None, phantom_data.SegData | None]:
    t0 = time.perf_counter()
    out = phantom_data.build(
        Path(args.cache), base_seed=phantom_data.TRAIN_SEED, n_dx=args.n_dx, n_ct_series=args.n_ct, workers=2,
        parts=(part,),
    )
    log.info("training data ready in %.0f s", time.perf_counter() - t0)
    return out


def native_bf16() -> bool:
    """Whether this CPU runs torch's BF16 autocast natively (oneDNN's BF16 kernels need
    AVX-512 or AMX). Without them torch emulates BF16, far slower than FP32."""
    try:  # the check torch's own mkldnn tests use; private, so guarded
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "NO AVX", "AVX2")


def _lr_factor(progress: float) -> float:
    """Warm-up over the first 5 % of training, then cosine decay to 5 %."""
    if progress < 0.05:
        return max(progress, 1e-3) / 0.05
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (progress - 0.05) / 0.95))


def _fit(
    net: nn.Module, args: argparse.Namespace, batch_loss: Callable[[float], torch.Tensor],
    monitor: Callable[[], str] | None = None,
) -> tuple[float, float, int]:
    """AdamW with warm-up and cosine decay over ``args.steps`` steps of ``batch_loss(progress)``,
    or over ``args.minutes`` of training when that is set (this CPU is shared, so a step
    count does not say how long a run takes; progress is then the larger of the step and
    the time fraction, and training stops at 1). Returns (mean loss of the last 100 steps,
    seconds, steps). ``monitor()`` (in eval mode, every ``args.monitor_every`` steps)
    reports on fixed batches; its time is not counted."""
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    amp = getattr(args, "amp", "none") == "bf16"
    if amp:  # bf16 autocast (AVX-512 BF16 / AMX CPUs) and NHWC: 1.6x the steps per minute here
        net.to(memory_format=torch.channels_last)
    budget = 60.0 * args.minutes if args.minutes > 0 else float("inf")
    losses: list[float] = []
    t0 = time.perf_counter()
    paused = 0.0
    net.train()
    step = 0
    while step < args.steps:
        elapsed = time.perf_counter() - t0 - paused
        progress = max(step / args.steps, elapsed / budget)
        if progress >= 1.0:
            break
        if monitor is not None and args.monitor_every and step and step % args.monitor_every == 0:
            tm = time.perf_counter()
            net.eval()
            log.info("step %d: %s", step, monitor())
            net.train()
            paused += time.perf_counter() - tm
        for group in opt.param_groups:
            group["lr"] = args.lr * _lr_factor(progress)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = batch_loss(progress)
        if not torch.isfinite(loss):
            raise RuntimeError(f"training diverged at step {step}: loss {float(loss)} (try a lower --lr, or --amp none)")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if step % 100 == 0:
            log.info("step %d/%d loss %.4f (%.0f s, progress %.2f)", step, args.steps, np.mean(losses[-100:]),
                     elapsed, progress)
        step += 1
    net.eval()
    net.to(memory_format=torch.contiguous_format)
    seconds = time.perf_counter() - t0 - paused
    log.info("stopped after %d steps, %.0f s", step, seconds)
    if monitor is not None:
        log.info("final: %s", monitor())
    return float(np.mean(losses[-100:])), seconds, step


def train_unet(args: argparse.Namespace) -> tuple[nn.Module, dict]:
    from monai.losses import DiceLoss

    _, seg = _data(args, "seg")
    assert seg is not None
    if args.slices == 3:  # 2.5-D: each CT patch's neighbouring slices, cached beside the main cache
        seg = phantom_data.build_neighbours(Path(args.cache), seg, base_seed=phantom_data.TRAIN_SEED,
                                            n_ct_series=args.n_ct)
    if args.data != "all":  # e.g. the lite model is for 512² CT streams
        seg = seg.subset(seg.is_ct if args.data == "ct" else ~seg.is_ct)
    net = build_unet(args.model, slices=args.slices, two_windows=args.two_windows, slice_mean=args.slice_mean)
    if args.resume:  # continue from earlier weights (the spec records the total steps)
        net.load_state_dict(torch.load(args.resume, map_location="cpu", weights_only=True))
    # Lesion pixels are a few per thousand: plain BCE settles on "background
    # everywhere" (seen: Dice stuck at 1.0 for 3000 steps). Batch Dice plus a
    # lesion-weighted BCE learns them.
    dice = DiceLoss(sigmoid=True, batch=True)
    pos_weight = torch.tensor(10.0)
    rng = np.random.default_rng(args.seed)

    def batch_loss(progress: float) -> torch.Tensor:
        # Lesion-rich batches first (radiograph nodules are learnt at all), then more of
        # the random patches (ribs, spine, collimator edges) that make false positives.
        frac = args.lesion_start + (args.lesion_end - args.lesion_start) * progress
        x, y = phantom_data.seg_batch(rng, seg, args.batch, crop=args.crop, ct_fraction=args.ct_fraction,
                                      lesion_fraction=frac, insert_small=args.insert_small, slices=args.slices,
                                      neighbour_drop=args.neighbour_drop, window=args.window,
                                      insert_lung=args.insert_lung, insert_faint=args.insert_faint,
                                      small_mm=args.insert_small_mm, insert_faint_dx=args.insert_faint_dx)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        logits = net(xt).float()  # the losses in fp32 under autocast
        weight = torch.from_numpy(small_lesion_weights(y, args.small_weight)) if args.small_weight > 0 else None
        bce = nn.functional.binary_cross_entropy_with_logits(logits, yt, weight=weight, pos_weight=pos_weight)
        return dice(logits, yt) + 0.5 * bce

    final, seconds, steps = _fit(net, args, batch_loss, _seg_monitor(net, seg, args.slices, args.window))
    info = {"steps": steps + args.prior_steps, "batch": args.batch, "crop": args.crop, "amp": args.amp, "data": args.data,
            "small_weight": args.small_weight, "insert_small": args.insert_small,
            **({"insert_small_mm": list(args.insert_small_mm)} if args.insert_small_mm != phantom_data.INSERT_SMALL_MM
               else {}),
            "slices": args.slices,
            "two_windows": args.two_windows, **({"slice_mean": True} if args.slice_mean else {}),
            "insert_lung": args.insert_lung, "insert_faint": args.insert_faint,
            **({"insert_faint_dx": args.insert_faint_dx} if args.insert_faint_dx > 0 else {}),
            "neighbour_drop": args.neighbour_drop if args.slices == 3 else 0.0,
            "window_jitter": _jitter_note(args), **_window_info(args),
            "lesion_fraction": [args.lesion_start, args.lesion_end], "spacing_mm": phantom_data.SEG_SPACING, "final_loss": final, "patches": int(len(seg.patches)),
            "seconds": round(seconds + args.prior_seconds, 1)}
    return net, info


def small_lesion_weights(y: np.ndarray, area: float, cap: float = 16.0) -> np.ndarray:
    """Per-pixel BCE weights: 1, and ``clip(area / lesion area, 1, cap)`` on each lesion's
    pixels. Batch Dice and plain BCE count pixels, so a 3 mm nodule (~30 pixels at 0.5 mm)
    weighs 1/40 of a 20 mm lesion and was not learnt (CT 2-5 mm: 1/11 found); here every
    lesion smaller than ``area`` pixels counts about as much as one of that size."""
    from scipy import ndimage

    w = np.ones_like(y, dtype=np.float32)
    for b in range(y.shape[0]):
        labels, n = ndimage.label(y[b, 0] >= 0.5)
        if n:
            sizes = np.bincount(labels.ravel())[1:].astype(np.float32)
            per = np.concatenate([[1.0], np.clip(area / sizes, 1.0, cap)]).astype(np.float32)
            w[b, 0] = per[labels]
    return w


def _seg_monitor(net: nn.Module, seg: phantom_data.SegData, slices: int = 1,
                 window: tuple[float, float] | None = None) -> Callable[[], str]:
    """Dice at p >= 0.5 on fixed batches of each modality (training patches: a learning
    signal, not a held-out figure)."""
    rng = np.random.default_rng(12345)
    fixed = {}
    for name, keep in (("dx", ~seg.is_ct), ("ct", seg.is_ct)):
        if keep.any():
            fixed[name] = phantom_data.seg_batch(rng, seg.subset(keep), 24, slices=slices, window=window)

    def report() -> str:
        out = []
        with torch.no_grad():
            for name, (x, y) in fixed.items():
                p = torch.sigmoid(net(torch.from_numpy(x))).numpy()
                hit, truth = p >= 0.5, y >= 0.5
                dice = 2 * (hit & truth).sum() / max(hit.sum() + truth.sum(), 1)
                on = float(p[truth].mean()) if truth.any() else float("nan")
                out.append(f"{name} dice {dice:.3f} p(on) {on:.2f} p(off) {float(p[~truth].mean()):.3f}")
        return "; ".join(out)

    return report


def _roi_monitor(net: nn.Module, roi: phantom_data.RoiData, slices: int = 1,
                 window: tuple[float, float] | None = None) -> Callable[[], str]:
    """Heatmap recall (lesion cells >= 0.3) and false cells on fixed windows per modality."""
    rng = np.random.default_rng(12345)
    fixed = {}
    for name, keep in (("dx", ~roi.is_ct), ("ct", roi.is_ct)):
        if keep.any():
            fixed[name] = phantom_data.roi_batch(rng, roi.subset(keep), 32, slices=slices, neighbour_drop=0.0,
                                                 window=window)

    def report() -> str:
        out = []
        with torch.no_grad():
            for name, (x, y, _) in fixed.items():
                _, heat = net(torch.from_numpy(x))
                h = torch.sigmoid(heat).numpy()[:, 0]
                target, valid = y[:, 0] > 0, y[:, 1] > 0
                recall = float((h[target] >= 0.3).mean()) if target.any() else float("nan")
                false = float((h[valid & ~target] >= 0.3).mean())
                out.append(f"{name} cell recall {recall:.2f} false cells {false:.4f}")
        return "; ".join(out)

    return report


def train_roi(args: argparse.Namespace) -> tuple[nn.Module, dict]:
    from monai.losses import DiceLoss

    roi, _ = _data(args, "roi")
    assert roi is not None
    if args.data != "all":
        roi = roi.subset(roi.is_ct if args.data == "ct" else ~roi.is_ct)
    if args.resume:  # the network the weights were saved from (1.0.0 has no local-contrast input)
        net: nn.Module = network_for(args.model, torch.load(args.resume, map_location="cpu", weights_only=True))
        net.train()
    else:
        net = RoiNet(edge=EDGE_CHANNEL.get(args.model, False), slices=args.slices, two_windows=args.two_windows)
    rng = np.random.default_rng(args.seed)
    pos_weight = torch.tensor(8.0)
    # Lesion cells are rare (a few in a thousand): batch Dice keeps the heatmap from
    # settling on "nothing anywhere"; weighted BCE keeps it calibrated.
    dice = DiceLoss(sigmoid=True, batch=True)

    def batch_loss(progress: float) -> torch.Tensor:
        x, y, p = phantom_data.roi_batch(rng, roi, args.batch, ct_fraction=args.ct_fraction, slices=args.slices,
                                         neighbour_drop=args.neighbour_drop, window=args.window,
                                         insert_lung=args.insert_lung)
        presence, heat = (t.float() for t in net(torch.from_numpy(x)))  # the losses in fp32 under autocast
        target, valid = torch.from_numpy(y[:, :1]), torch.from_numpy(y[:, 1:])
        per_cell = nn.functional.binary_cross_entropy_with_logits(heat, target, pos_weight=pos_weight, reduction="none")
        return (
            (per_cell * valid).sum() / valid.sum()
            + dice(heat * valid + (valid - 1) * 20.0, target)  # invalid (padding) cells: certain background
            + nn.functional.binary_cross_entropy_with_logits(presence, torch.from_numpy(p))
        )

    final, seconds, steps = _fit(net, args, batch_loss, _roi_monitor(net, roi, args.slices, args.window))
    info = {"steps": steps + args.prior_steps, "batch": args.batch, "thumbnails": len(roi.thumbs),
            "amp": args.amp, "window_jitter": _jitter_note(args), **_window_info(args), "slices": args.slices,
            "neighbour_drop": args.neighbour_drop if args.slices == 3 else 0.0,
            "two_windows": args.two_windows, "insert_lung": args.insert_lung,
            "data": args.data, "final_loss": final, "seconds": round(seconds + args.prior_seconds, 1)}
    return net, info


def export(net: nn.Module, name: str, out: Path, roi: bool) -> Path:
    """ONNX (opset 17, dynamic H/W), checked against torch with onnxruntime."""
    import onnxruntime as ort

    path = out / f"{name}.onnx"
    size = 512 if roi else 256
    channels = getattr(net, "slices", 1)  # 2.5-D UNets take three slices
    x = torch.rand(1, channels, size, size)
    if roi:
        names, dyn = ["presence", "heatmap"], {"image": {2: "H", 3: "W"}, "heatmap": {2: "h", 3: "w"}}
    else:
        names, dyn = ["logits"], {"image": {2: "H", 3: "W"}, "logits": {2: "H", 3: "W"}}
    torch.onnx.export(net, (x,), str(path), opset_version=OPSET, input_names=["image"], output_names=names,
                      dynamic_axes=dyn, dynamo=False)
    _rewrite(path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in ((1, channels, size, size), (1, channels, 2 * size, size)):
        xi = torch.rand(*shape)
        with torch.no_grad():
            ref = net(xi)
        ref = ref if isinstance(ref, tuple) else (ref,)
        got = sess.run(None, {"image": xi.numpy()})
        for a, b in zip(ref, got, strict=True):
            err = float(np.abs(a.numpy() - b).max())
            if err > 1e-3:
                raise RuntimeError(f"ONNX output differs from torch by {err} for {shape}")
    return path


def _rewrite(path: Path) -> None:
    """Replace the graph's PRelu, ConvTranspose and one-channel pooling layers by exact
    equivalents that ONNX Runtime's CPU provider runs faster and can run in INT8
    (``medrt.engine.rewrite``); :func:`export` then checks the result against torch."""
    import onnx

    from medrt.engine.rewrite import cpu_friendly

    model, report = cpu_friendly(onnx.load(str(path)))
    onnx.save(model, str(path))
    log.info("%s: %s", path.name, report.summary())


def export_only(name: str, out: Path, version: str | None = None) -> Path:
    """Export ``out/<name>.pt`` again (no training) and update its spec's version (default:
    the spec's with the patch number raised: the same weights in a new graph), sha256 and
    export note in place; the spec's tuned thresholds and training record are kept. An
    ensemble's ``.pt`` (members' weights) is exported as one graph again."""
    spec = out / f"{name}.toml"
    if not spec.is_file():
        raise SystemExit(f"{spec}: no spec to update (train the model first)")
    text = spec.read_text(encoding="utf-8")
    if version is None:
        found = re.search(r'(?m)^version = "(\d+)\.(\d+)\.(\d+)"$', text)
        if found is None:
            raise SystemExit(f"{spec}: no major.minor.patch version to raise; give --version")
        version = f"{found[1]}.{found[2]}.{int(found[3]) + 1}"
    net = network_for(name, torch.load(out / f"{name}.pt", map_location="cpu", weights_only=True)).eval()
    onnx_path = export(net, name, out, name in ROI_MODELS)
    members = re.search(r"(?m)^members = (\d+)$", text)
    note = EXPORT_NOTE + (f"; {ENSEMBLE_NOTE.format(n=members[1])}" if members else "")
    text = re.sub(r'(?m)^version = ".*"$', f'version = "{version}"', text, count=1)
    text = re.sub(r'(?m)^(# \S+) \S+:', rf"\1 {version}:", text, count=1)  # the heading comment
    text = re.sub(r'(?m)^sha256 = ".*"$', f'sha256 = "{sha256_file(onnx_path)}"', text, count=1)
    if re.search(r"(?m)^export = ", text):
        text = re.sub(r'(?m)^export = ".*"$', f'export = "{note}"', text, count=1)
    else:
        text = re.sub(r'(?m)^(card = ".*")$', rf'\1\nexport = "{note}"', text, count=1)
    spec.write_text(text, encoding="utf-8")
    return spec


def _resumed(args: argparse.Namespace) -> str:
    if not getattr(args, "resume", ""):
        return ""
    # the options that resumed, so the command on the card reruns what was run
    resumed = f" --resume {args.resume} --prior-steps {args.prior_steps} --prior-seconds {args.prior_seconds:g}"
    if args.prior_command:
        return (f"{resumed}; continuing the weights of a first run of {args.prior_steps} steps "
                f"({args.prior_seconds:g} s): {args.prior_command}")
    return f"{resumed}, continuing a first run of {args.prior_steps} steps with the same command"


def _jitter_note(args: argparse.Namespace) -> str:
    if args.window is None:
        return phantom_data.JITTER_NOTE
    return "CT: the fixed window ±2 % centre, ×0.9–1.1 width; " + phantom_data.JITTER_NOTE.split("; ", 1)[1]


def _window_info(args: argparse.Namespace) -> dict:
    return {} if args.window is None else {"window": list(args.window)}


def _window_arg(text: str) -> tuple[float, float]:
    """``--window CENTER,WIDTH`` in HU."""
    try:
        center, width = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CENTER,WIDTH in HU (e.g. -300,1400), got {text!r}") from None
    if width <= 0:
        raise argparse.ArgumentTypeError(f"the window width must be > 0, got {width:g}")
    return center, width


def _size_range(text: str) -> tuple[float, float]:
    """``--insert-small-mm LO,HI`` in mm."""
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI in mm (e.g. 2,10), got {text!r}") from None
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"expected 0 < LO <= HI, got {text!r}")
    return lo, hi


def _minutes(args: argparse.Namespace) -> str:
    return f" --minutes {args.minutes:g}" if args.minutes > 0 else ""


def _seg_args(args: argparse.Namespace) -> str:
    out = f" --ct-fraction {args.ct_fraction:g}" if args.ct_fraction != 0.5 else ""
    out += f" --amp {args.amp}" if args.amp != "none" else ""
    out += f" --crop {args.crop}" if args.crop != 256 and args.model not in ROI_MODELS else ""
    nb = f" --slices 3 --neighbour-drop {args.neighbour_drop:g}" if args.slices == 3 else ""
    nb += f" --window={args.window[0]:g},{args.window[1]:g}" if args.window is not None and not args.two_windows else ""
    lung = f" --insert-lung {args.insert_lung:g}" if args.insert_lung > 0 else ""
    lung += " --two-windows" if args.two_windows else ""
    lung += " --slice-mean" if args.slice_mean else ""
    if args.model in ROI_MODELS:
        return out + nb + lung
    out += f" --small-weight {args.small_weight:g}" if args.small_weight > 0 else ""
    out += f" --insert-small {args.insert_small:g}" if args.insert_small > 0 else ""
    if args.insert_small > 0 and args.insert_small_mm != phantom_data.INSERT_SMALL_MM:
        out += f" --insert-small-mm {args.insert_small_mm[0]:g},{args.insert_small_mm[1]:g}"
    out += f" --insert-faint {args.insert_faint:g}" if args.insert_faint > 0 else ""
    out += f" --insert-faint-dx {args.insert_faint_dx:g}" if args.insert_faint_dx > 0 else ""
    out += nb + lung
    return out + f" --lesion-start {args.lesion_start} --lesion-end {args.lesion_end}"


def _data_note(args: argparse.Namespace) -> str:
    used = {"all": "both", "ct": "CT only", "dx": "radiographs only"}[args.data]
    if args.model in ROI_MODELS:
        return f"; thumbnails of {used}, longest side {phantom_data.THUMB}"
    return f"; patches of {used}, radiographs area-averaged to {phantom_data.SEG_SPACING} mm"


def write_spec(name: str, onnx_path: Path, info: dict, args: argparse.Namespace) -> Path:
    roi = name in ROI_MODELS
    lines = [
        "[model]",
        f'name = "{name}"',
        f'version = "{VERSIONS[name]}"',
        f'task = "{"roi_classifier" if roi else "segmentation"}"',
        f'file = "{onnx_path.name}"',
        f'sha256 = "{sha256_file(onnx_path)}"',
        f'card = "{name}.md"',
        f'export = "{EXPORT_NOTE}"',
        f"multiple_of = {16 if not roi else 8}",
    ]
    # What it was trained on: the analyzer routes frames by it and refuses the rest with
    # an error naming the file (a CT/radiograph model marks dozens of "lesions" on an
    # ultrasound or a test pattern).
    lines.append(f"modalities = {json.dumps(list(MODALITIES[args.data]))}")
    if args.data == "ct":  # axial slices only (a frontal radiograph lies in the coronal plane: not for "all")
        lines.append('planes = ["AXIAL"]')
    if args.data in BODY_PARTS:
        lines.append(f"body_parts = {json.dumps(list(BODY_PARTS[args.data]))}")
        lines.append(f"views = {json.dumps(list(VIEWS[args.data]))}")
    if roi:
        lines += [f"slices = {args.slices}"] if args.slices == 3 else []
        lines += [f"thumbnail = {phantom_data.THUMB}", f"stride = {phantom_data.STRIDE}",
                  'description = "MobileNet-style ROI classifier on the frame thumbnail: frame-level lesion presence and a'
                  f' per-cell lesion heatmap{TWO_WINDOWS_NOTE if args.two_windows else ""}."']
    else:
        cfg = UNET_VARIANTS[name]
        # 2.5-D: its neighbours were the phantom's next slices, 3 or 5 mm away; on a thinner
        # series the slice nearest 3 mm stands in for them (lesion_unet_lite's card)
        lines += [f"slices = {args.slices}", "neighbour_mm = 3.0"] if args.slices == 3 else []
        lines += [f"spacing_mm = {phantom_data.SEG_SPACING}",
                  f'description = "MONAI UNet channels {list(cfg["channels"])}, strides {list(cfg["strides"])}, '
                  f'{cfg["num_res_units"]} residual unit(s): lesion probability per pixel at '
                  f'{phantom_data.SEG_SPACING} mm (finer frames are area-averaged to it)'
                  f'{TWO_WINDOWS_NOTE if args.two_windows else ""}."']
    if args.window is None:
        lines += ["", "[normalization]", 'method = "window"']
        by = "this frame's VOI window" if args.slices == 3 else "its VOI window"
    else:
        lines += ["", "[normalization]", 'method = "fixed_window"', f"center = {args.window[0]:g}",
                  f"width = {args.window[1]:g}"]
        by = f"the fixed window {args.window[0]:g}/{args.window[1]:g} HU"
    lines += ["", "[[inputs]]", 'name = "image"']
    if args.slices == 3:
        what = "thumbnail of the previous, this and next slice" if roi else "previous, this and next slice"
        lines += ['shape = [1, 3, "H", "W"]', f'meaning = "{what} of the series, each '
                  f'normalised by {by} to 0..1 (a missing neighbour: this slice again)"', ""]
    else:
        lines += ['shape = [1, 1, "H", "W"]', f'meaning = "frame (or thumbnail) normalised by {by} to 0..1"', ""]
    if roi:
        lines += ["[[outputs]]", 'name = "presence"', "shape = [1, 1]", 'activation = "sigmoid"',
                  'meaning = "frame-level lesion presence logit"', "",
                  "[[outputs]]", 'name = "heatmap"', 'shape = [1, 1, "h", "w"]', 'activation = "sigmoid"',
                  f'meaning = "lesion logit per {phantom_data.STRIDE}x{phantom_data.STRIDE} thumbnail cell"', "",
                  "[thresholds]", "presence = 0.5", "heatmap = 0.3", ""]
    else:
        lines += ["[[outputs]]", 'name = "logits"', 'shape = [1, 1, "H", "W"]', 'activation = "sigmoid"',
                  'meaning = "lesion logit per pixel"', "", "[thresholds]", "probability = 0.5", ""]
    lines += ["[training]",
              f'data = "medrt.phantom: {args.n_dx} DX 4096² radiographs + {args.n_ct} CT series x 40 slices, seeds from {phantom_data.TRAIN_SEED}{_data_note(args)}"',
              f'command = "python -m medrt.models.train {args.model} --steps {args.steps}{_minutes(args)} --batch {args.batch} --lr {args.lr} --seed {args.seed} --data {args.data} --n-dx {args.n_dx} --n-ct {args.n_ct}{_seg_args(args)}{_resumed(args)}"',
              f"seconds = {info['seconds']}",
              f'machine = "{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}"',
              f"details = {json.dumps(json.dumps(info))}", ""]
    spec = onnx_path.with_suffix(".toml")
    spec.write_text("\n".join(lines), encoding="utf-8")
    return spec


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m medrt.models.train`` (tests/test_docs_commands.py parses the
    docs' commands with it)."""
    p = argparse.ArgumentParser(prog="python -m medrt.models.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", choices=[*ROI_MODELS, *UNET_VARIANTS])
    p.add_argument("--steps", type=int, default=2000, help="at most this many steps")
    p.add_argument("--minutes", type=float, default=0.0,
                   help="train for this long instead (the schedule follows time; 0: follow --steps)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-dx", type=int, default=320, help="radiographs to generate")
    p.add_argument("--n-ct", type=int, default=24, help="CT series (40 slices each) to generate")
    p.add_argument("--resume", default="", help="weights (.pt) to continue from")
    p.add_argument("--prior-steps", type=int, default=0, help="steps already trained in --resume (for the record)")
    p.add_argument("--prior-seconds", type=float, default=0.0, help="training seconds already spent in --resume")
    p.add_argument("--prior-command", default="", help="the command that made --resume, when it differs")
    p.add_argument("--data", choices=["all", "ct", "dx"], default="all", help="patches / thumbnails to train on")
    p.add_argument("--build-only", action="store_true", help="build the phantom cache and stop")
    p.add_argument("--export-only", action="store_true",
                   help="export the shipped OUT/MODEL.pt again (no training); update the spec's version, sha256 "
                        "and export note")
    p.add_argument("--version", default=None,
                   help="with --export-only: the new version (default: the spec's, patch number + 1)")
    p.add_argument("--crop", type=int, default=256, help="UNet training crop side (pixels at 0.5 mm)")
    p.add_argument("--amp", choices=["none", "bf16"], default="none",
                   help="bf16 autocast with channels-last tensors (needs a CPU with BF16 support)")
    p.add_argument("--ct-fraction", type=float, default=0.5, help="share of CT crops when both kinds are there")
    p.add_argument("--lesion-start", type=float, default=0.6, help="share of crops holding a lesion, first step")
    p.add_argument("--lesion-end", type=float, default=0.6, help="... and last step (linear in between)")
    p.add_argument("--small-weight", type=float, default=0.0, metavar="PIXELS",
                   help="UNets: weight each lesion's BCE pixels by PIXELS / its area (1..16), so small lesions"
                        " count like large ones (0: off)")
    p.add_argument("--insert-small", type=float, default=0.0, metavar="P",
                   help="share of CT crops that get 1-3 small (2-6 mm) soft-tissue lesions drawn in "
                        "(models/data.py insert_small_lesions)")
    p.add_argument("--insert-small-mm", type=_size_range, default=phantom_data.INSERT_SMALL_MM, metavar="LO,HI",
                   help="with --insert-small: the inserted lesions' diameters, log-uniform (default 2,6); each shows "
                        "on one slice")
    p.add_argument("--slices", type=int, choices=[1, 3], default=1,
                   help="3 = 2.5-D, the previous and next slice of a CT series as extra input channels")
    p.add_argument("--neighbour-drop", type=float, default=0.15, metavar="P",
                   help="with --slices 3: chance that each neighbour is replaced by the slice itself in training")
    p.add_argument("--insert-lung", type=float, default=0.0, metavar="P",
                   help="share of CT crops (classifiers: CT windows) cut around lung parenchyma with 1-2 lung"
                        " nodules drawn in across the slices (models/data.py insert_lung_nodules)")
    p.add_argument("--insert-faint", type=float, default=0.0, metavar="P",
                   help="UNets: share of CT crops that get 1-2 faint (1.5-3x the noise) 5-15 mm soft-tissue lesions"
                        " drawn in across the slices (models/data.py insert_faint_lesions)")
    p.add_argument("--insert-faint-dx", type=float, default=0.0, metavar="P",
                   help="UNets: share of radiograph crops that get 1-3 faint (25-50 units) 2-6 mm nodules drawn in"
                        " (models/data.py insert_faint_nodules)")
    p.add_argument("--two-windows", action="store_true",
                   help="with --data ct: read CT in the fixed wide window "
                        f"{WIDE_WINDOW[0]:g},{WIDE_WINDOW[1]:g} and cut the soft-tissue window from it inside the graph"
                        " (models/networks.py TwoWindows); sets --window to it")
    p.add_argument("--slice-mean", action="store_true",
                   help="UNets, with --two-windows --slices 3: one more input channel, the local contrast of the"
                        " three slices' mean (models/networks.py TwoWindows)")
    p.add_argument("--window", type=_window_arg, default=None, metavar="CENTER,WIDTH",
                   help="normalise CT by this fixed window (HU) instead of each slice's VOI window, and say so "
                        "in the spec ([normalization] fixed_window); needs --data ct; write --window=-300,1400")
    p.add_argument("--monitor-every", type=int, default=500, help="log Dice on fixed batches every N steps (0: never)")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "medrt" / "train"))
    p.add_argument("--out", default="models")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.amp == "bf16" and not native_bf16():
        p.error(f"--amp bf16: this CPU has no BF16 kernels (torch reports {torch.backends.cpu.get_cpu_capability()};"
                " oneDNN needs AVX-512 or AMX), so torch would emulate them at about a quarter of FP32's steps"
                " (measured on an AVX2 EPYC: 1.0 against 3.7 steps/s) and a --minutes run would stop"
                " undertrained; leave --amp out")
    if args.two_windows:
        if args.data != "ct":
            p.error("--two-windows reads CT in a fixed window (HU): it needs --data ct")
        if args.window not in (None, WIDE_WINDOW):
            p.error(f"--two-windows reads the fixed window {WIDE_WINDOW[0]:g},{WIDE_WINDOW[1]:g}; leave --window out")
        args.window = WIDE_WINDOW
    if args.slice_mean and not (args.two_windows and args.slices == 3 and args.model not in ROI_MODELS):
        p.error("--slice-mean is a UNet input with --two-windows --slices 3")
    if args.window is not None and args.data != "ct":
        p.error("--window is a CT window (HU): it needs --data ct")
    if args.model == "lesion_unet_dx" and args.data != "dx" and not args.export_only:
        p.error("lesion_unet_dx is the radiograph segmenter: train it with --data dx")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.build_only:
        _data(args, "seg")
        return 0
    if args.export_only:
        log.info("wrote %s", export_only(args.model, out, args.version))
        return 0
    roi = args.model in ROI_MODELS
    net, info = train_roi(args) if roi else train_unet(args)
    # The weights ship too (small), so tests can compare ONNX with torch and users can fine-tune.
    torch.save(net.state_dict(), out / f"{args.model}.pt")
    onnx_path = export(net, args.model, out, roi)
    spec = write_spec(args.model, onnx_path, info, args)
    log.info("wrote %s and %s (%s s of training)", onnx_path, spec, info["seconds"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
