"""Train a shipped model on phantoms, export it to ONNX and write its spec.

    python -m medrt.models.train roi --steps 1500 --out models
    python -m medrt.models.train lesion_unet --steps 2500 --out models
    python -m medrt.models.train lesion_unet_lite --steps 2500 --out models

Needs the ``train`` extra (torch, MONAI, onnx). Runs on the CPU. The phantom
data is generated once into ``--cache`` (deterministic, rebuildable).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from medrt.engine.registry import sha256_file
from medrt.models import data as phantom_data
from medrt.models.networks import UNET_VARIANTS, RoiNet, build_unet

log = logging.getLogger("medrt.models.train")

VERSION = "1.0.0"
OPSET = 17


def _data(args: argparse.Namespace) -> tuple[phantom_data.RoiData, phantom_data.SegData]:
    return phantom_data.build(
        Path(args.cache), base_seed=phantom_data.TRAIN_SEED, n_dx=args.n_dx, n_ct_series=args.n_ct, workers=2
    )


def _schedule(opt: torch.optim.Optimizer, steps: int, lr: float) -> torch.optim.lr_scheduler.LambdaLR:
    warm = max(1, steps // 20)

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))

    return torch.optim.lr_scheduler.LambdaLR(opt, f)


def _fit(net: nn.Module, args: argparse.Namespace, batch_loss: Callable[[], torch.Tensor]) -> tuple[float, float]:
    """AdamW with warm-up and cosine decay over ``args.steps`` steps of ``batch_loss()``;
    returns (mean loss of the last 100 steps, seconds)."""
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = _schedule(opt, args.steps, args.lr)
    losses: list[float] = []
    t0 = time.perf_counter()
    net.train()
    for step in range(args.steps):
        loss = batch_loss()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if step % 100 == 0 or step == args.steps - 1:
            log.info("step %d/%d loss %.4f (%.0f s)", step, args.steps, np.mean(losses[-100:]), time.perf_counter() - t0)
    net.eval()
    return float(np.mean(losses[-100:])), time.perf_counter() - t0


def train_unet(args: argparse.Namespace) -> tuple[nn.Module, dict]:
    from monai.losses import DiceLoss

    _, seg = _data(args)
    if args.data != "all":  # e.g. the lite model is for 512² CT streams
        keep = seg.is_ct if args.data == "ct" else ~seg.is_ct
        seg = phantom_data.SegData(seg.patches[keep], seg.windows[keep], seg.masks[keep], seg.is_ct[keep])
    net = build_unet(args.model)
    if args.resume:  # continue from earlier weights (the spec records the total steps)
        net.load_state_dict(torch.load(args.resume, map_location="cpu", weights_only=True))
    # Lesion pixels are a few per thousand: plain BCE settles on "background
    # everywhere" (seen: Dice stuck at 1.0 for 3000 steps). Batch Dice plus a
    # lesion-weighted BCE learns them.
    dice = DiceLoss(sigmoid=True, batch=True)
    bce = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(10.0))
    rng = np.random.default_rng(args.seed)

    def batch_loss() -> torch.Tensor:
        x, y = phantom_data.seg_batch(rng, seg, args.batch)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        logits = net(xt)
        return dice(logits, yt) + 0.5 * bce(logits, yt)

    final, seconds = _fit(net, args, batch_loss)
    info = {"steps": args.steps + args.prior_steps, "batch": args.batch, "crop": 256, "data": args.data,
            "final_loss": final, "patches": int(len(seg.patches)),
            "seconds": round(seconds + args.prior_seconds, 1)}
    return net, info


def train_roi(args: argparse.Namespace) -> tuple[nn.Module, dict]:
    from monai.losses import DiceLoss

    roi, _ = _data(args)
    if args.data != "all":  # data.build() caches the n_dx radiographs first, then the CT slices
        sl = slice(args.n_dx, None) if args.data == "ct" else slice(0, args.n_dx)
        roi = phantom_data.RoiData(roi.thumbs[sl], roi.windows[sl], roi.targets[sl], roi.presence[sl])
    net = RoiNet()
    rng = np.random.default_rng(args.seed)
    pos_weight = torch.tensor(8.0)
    # Lesion cells are rare (a few in a thousand): batch Dice keeps the heatmap from
    # settling on "nothing anywhere"; weighted BCE keeps it calibrated.
    dice = DiceLoss(sigmoid=True, batch=True)

    def batch_loss() -> torch.Tensor:
        x, y, p = phantom_data.roi_batch(rng, roi, args.batch)
        presence, heat = net(torch.from_numpy(x))
        target, valid = torch.from_numpy(y[:, :1]), torch.from_numpy(y[:, 1:])
        per_cell = nn.functional.binary_cross_entropy_with_logits(heat, target, pos_weight=pos_weight, reduction="none")
        return (
            (per_cell * valid).sum() / valid.sum()
            + dice(heat * valid + (valid - 1) * 20.0, target)  # invalid (padding) cells: certain background
            + nn.functional.binary_cross_entropy_with_logits(presence, torch.from_numpy(p))
        )

    final, seconds = _fit(net, args, batch_loss)
    info = {"steps": args.steps, "batch": args.batch, "thumbnails": len(roi.thumbs), "data": args.data,
            "final_loss": final, "seconds": round(seconds, 1)}
    return net, info


def export(net: nn.Module, name: str, out: Path, roi: bool) -> Path:
    """ONNX (opset 17, dynamic H/W), checked against torch with onnxruntime."""
    import onnxruntime as ort

    path = out / f"{name}.onnx"
    size = 512 if roi else 256
    x = torch.rand(1, 1, size, size)
    if roi:
        names, dyn = ["presence", "heatmap"], {"image": {2: "H", 3: "W"}, "heatmap": {2: "h", 3: "w"}}
    else:
        names, dyn = ["logits"], {"image": {2: "H", 3: "W"}, "logits": {2: "H", 3: "W"}}
    torch.onnx.export(net, (x,), str(path), opset_version=OPSET, input_names=["image"], output_names=names,
                      dynamic_axes=dyn, dynamo=False)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in ((1, 1, size, size), (1, 1, 2 * size, size)):
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


def _resumed(args: argparse.Namespace) -> str:
    if not getattr(args, "resume", ""):
        return ""
    return f", continuing a first run of {args.prior_steps} steps with the same command"


def write_spec(name: str, onnx_path: Path, info: dict, args: argparse.Namespace) -> Path:
    roi = name == "roi_classifier"
    lines = [
        "[model]",
        f'name = "{name}"',
        f'version = "{VERSION}"',
        f'task = "{"roi_classifier" if roi else "segmentation"}"',
        f'file = "{onnx_path.name}"',
        f'sha256 = "{sha256_file(onnx_path)}"',
        f'card = "{name}.md"',
        f"multiple_of = {16 if not roi else 8}",
    ]
    if roi:
        lines += [f"thumbnail = {phantom_data.THUMB}", f"stride = {phantom_data.STRIDE}",
                  'description = "MobileNet-style ROI classifier on the frame thumbnail: frame-level lesion presence and a per-cell lesion heatmap."']
    else:
        cfg = UNET_VARIANTS[name]
        lines += [f'description = "MONAI UNet channels {list(cfg["channels"])}, strides {list(cfg["strides"])}, '
                  f'{cfg["num_res_units"]} residual unit(s): lesion probability per pixel."']
    lines += ["", "[normalization]", 'method = "window"', "", "[[inputs]]", 'name = "image"',
              'shape = [1, 1, "H", "W"]', 'meaning = "frame (or thumbnail) normalised by its VOI window to 0..1"', ""]
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
              f'data = "medrt.phantom: {args.n_dx} DX 4096² radiographs + {args.n_ct} CT series x 40 slices, seeds from {phantom_data.TRAIN_SEED}"',
              f'command = "python -m medrt.models.train {args.model} --steps {args.steps} --batch {args.batch} --lr {args.lr} --seed {args.seed} --data {args.data}{_resumed(args)}"',
              f"seconds = {info['seconds']}",
              f'machine = "{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}"',
              f"details = {json.dumps(json.dumps(info))}", ""]
    spec = onnx_path.with_suffix(".toml")
    spec.write_text("\n".join(lines), encoding="utf-8")
    return spec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m medrt.models.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", choices=["roi_classifier", *UNET_VARIANTS])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-dx", type=int, default=240, help="radiographs to generate")
    p.add_argument("--n-ct", type=int, default=24, help="CT series (40 slices each) to generate")
    p.add_argument("--resume", default="", help="segmentation weights (.pt) to continue from")
    p.add_argument("--prior-steps", type=int, default=0, help="steps already trained in --resume (for the record)")
    p.add_argument("--prior-seconds", type=float, default=0.0, help="training seconds already spent in --resume")
    p.add_argument("--data", choices=["all", "ct", "dx"], default="all", help="segmentation patches to train on")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "medrt" / "train"))
    p.add_argument("--out", default="models")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    roi = args.model == "roi_classifier"
    net, info = train_roi(args) if roi else train_unet(args)
    # The weights ship too (small), so tests can compare ONNX with torch and users can fine-tune.
    torch.save(net.state_dict(), out / f"{args.model}.pt")
    onnx_path = export(net, args.model, out, roi)
    spec = write_spec(args.model, onnx_path, info, args)
    log.info("wrote %s and %s (%s s of training)", onnx_path, spec, info["seconds"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
