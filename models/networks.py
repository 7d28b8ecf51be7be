"""Network definitions (torch; needs the ``train`` extra). Inference runs the ONNX exports."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["RoiNet", "Ensemble", "LocalContrast", "box_mean", "LocalContrastUNet", "NeighbourDifference", "NEIGHBOUR_GAIN", "TwoWindows",
           "WIDE_WINDOW", "SOFT_WINDOW", "build_unet", "network_for", "UNET_VARIANTS", "EDGE_CHANNEL", "EDGE_GAIN"]

# MONAI UNet settings per variant: lesion_unet for 1024² crops (≈ 0.8 M parameters),
# lesion_unet_lite for 512² CT streams at 30 frames/s. Batch norm, not MONAI's default
# instance norm: its output does not depend on what else is in the crop (padding, tiling
# and crop position give the same lesion), and ONNX Runtime folds it into the convolutions.
UNET_VARIANTS = {
    # The lite recipe at twice the width: a residual-unit / ReLU variant of this
    # network did not learn within the CPU budget (Dice stuck near zero).
    "lesion_unet": {"channels": (16, 32, 64, 128, 256), "strides": (2, 2, 2, 2), "num_res_units": 0, "norm": "batch"},
    "lesion_unet_lite": {"channels": (8, 16, 32, 64, 128), "strides": (2, 2, 2, 2), "num_res_units": 0, "norm": "batch"},
}
# lesion_unet_dx: lesion_unet's network trained on radiographs only (--data dx), the
# segmenter the analyzer routes radiographs to; it shares lesion_unet's settings below.
UNET_VARIANTS["lesion_unet_dx"] = UNET_VARIANTS["lesion_unet"]


LOCAL_WINDOW = 31  # px at 0.5 mm: 15.5 mm, the scale of "local" for the contrast channel
LOCAL_GAIN = 25.0  # a faint radiograph nodule (25 of 3800 window units) becomes ~0.16
# The contrast channel's own smoothing per variant (1: none). CT noise (~12 HU, 3 % of a
# 400 HU window) is amplified by the gain too; a 3x3 mean first takes most of it out.
CONTRAST_SMOOTH = {"lesion_unet": 1, "lesion_unet_dx": 1, "lesion_unet_lite": 3}
# The edge channel: tanh(gain · (3×3 box mean − 9×9 box mean)), a band-pass that keeps a
# nodule's sharp rim and drops the smooth lung texture of the same amplitude (25 units over
# ~8 mm): faint radiograph nodules in the lungs were missed even on training frames without
# it (an 8-minute radiograph-only run found 14 of 32 validation nodules with it, 7 without).
# The gain puts a faint rim (25 of 3800 units) near 0.4; CT noise saturates it, and the
# network learns CT from the other two channels.
EDGE_INNER, EDGE_OUTER = 3, 9
EDGE_GAIN = 200.0
# Which networks get it (lesion_unet from 2.2); older weights load without it. A
# roi_classifier_dx with it, trained 28 min on one thread beside another training, did
# not beat the shipped 1.1 (validation: same coverage with 10.3 crops per radiograph
# instead of 6.4), so the classifiers stay as they are.
EDGE_CHANNEL = {"lesion_unet": True, "lesion_unet_dx": True}


def _weight_dtype(module: nn.Module) -> torch.dtype:
    """The dtype of ``module``'s first parameter: float16 in a half-precision copy."""
    return next(module.parameters()).dtype


# The box means of the fixed fronts below, each the mean over the pixels of a k x k
# window inside the frame (avg_pool2d with count_include_pad=False; k odd). Up to
# SMALL_BOX a window is one 2-D pool over every channel at once; from RUNNING_BOX it is
# two 1-D passes of running sums (cumsum), whose cost does not grow with k; in between,
# two 1-D pools. Measured with ONNX Runtime on one thread of the AVX2 CPU at 512²,
# against the 1-D pools per channel the fronts used before (twenty-second session):
# three slices' 3x3 means 1.1 against 4.0 ms, a 31 x 31 mean 1.8 against 3.4 ms. The
# running sums differ from a pool by float rounding (5e-6 over 512² frames in [0, 1]),
# and ONNX Runtime's from torch's about as much: fine for the 31-px window (gain 25),
# but the edge channel's 9-px one (gain 200) made lesion_unet_dx's ONNX differ from
# torch by 1.3e-3, over train.export's check, so small windows stay pools. They run in
# float32 like the rest of the fronts (cumsum is not on CPU autocast's bfloat16 list).
SMALL_BOX, RUNNING_BOX = 3, 15


def box_mean(x: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` x ``k`` box mean of every channel of ``x`` (N, C, H, W), over the pixels
    inside the frame: ``avg_pool2d(x, k, 1, k // 2, count_include_pad=False)``."""
    if k % 2 != 1:
        raise ValueError(f"box windows are odd, got {k}")
    if k == 1:
        return x
    if k <= SMALL_BOX:
        return nn.functional.avg_pool2d(x, k, stride=1, padding=k // 2, count_include_pad=False)
    if k < RUNNING_BOX:
        x = nn.functional.avg_pool2d(x, (1, k), stride=1, padding=(0, k // 2), count_include_pad=False)
        return nn.functional.avg_pool2d(x, (k, 1), stride=1, padding=(k // 2, 0), count_include_pad=False)
    return _running_mean(_running_mean(x, k, 3), k, 2)


def _running_mean(x: torch.Tensor, k: int, dim: int) -> torch.Tensor:
    """The 1-D mean over ``k`` pixels along ``dim`` (2: columns, 3: rows) from a running
    sum, divided by how many of them lie inside the frame."""
    half, n = k // 2, x.shape[dim]
    pad = (half + 1, half, 0, 0) if dim == 3 else (0, 0, half + 1, half)
    total = torch.cumsum(nn.functional.pad(x, pad), dim)
    sums = total.narrow(dim, k, n) - total.narrow(dim, 0, n)
    ones = torch.ones_like(x[:1, :1, :1, :] if dim == 3 else x[:1, :1, :, :1])  # one row or column
    counted = torch.cumsum(nn.functional.pad(ones, pad), dim)
    return sums / (counted.narrow(dim, k, n) - counted.narrow(dim, 0, n))


class LocalContrast(nn.Module):
    """The input and a fixed local-contrast channel: ``[x, tanh(gain · (x - box_mean(x)))]``
    over a ``window``² box (:func:`box_mean`: running sums, whose cost does not grow with the window).

    Radiograph nodules are 0.7-8 % of their window, against CT lesions at 10-50 % of
    theirs, and ribs and edges are larger still: a plain UNet trained on both learned
    CT and ignored the radiographs (p ≈ 0 on their nodules after 3500 steps). The
    compressed local contrast puts faint bumps on the same footing as strong edges.
    It is part of the graph, so inference still feeds one normalised channel.
    """

    def __init__(self, window: int = LOCAL_WINDOW, gain: float = LOCAL_GAIN, smooth: int = 1,
                 edge_gain: float = 0.0) -> None:
        super().__init__()
        self.window, self.gain, self.smooth, self.edge_gain = window, gain, smooth, edge_gain

    @property
    def channels(self) -> int:
        """Channels out: the input and its local contrast, and the edge channel when on."""
        return 3 if self.edge_gain > 0 else 2

    def forward(self, x: torch.Tensor, smoothed: torch.Tensor | None = None) -> torch.Tensor:
        """``smoothed``: ``box_mean(x, self.smooth)`` when the caller has it already."""
        local = x if self.smooth <= 1 else box_mean(x, self.smooth) if smoothed is None else smoothed
        out = [x, torch.tanh(self.gain * (local - box_mean(x, self.window)))]
        if self.edge_gain > 0:
            out.append(torch.tanh(self.edge_gain * (box_mean(x, EDGE_INNER) - box_mean(x, EDGE_OUTER))))
        return torch.cat(out, dim=1)


# 2.5-D inputs (``slices = 3``): the previous and next slice of a CT series come in as
# channels 0 and 2 around the slice itself, and reach the UNet as their smoothed
# difference from it, tanh(gain · (box3(neighbour) − box3(slice))): ~0 where anatomy goes
# on through the slices (a vessel, a bowel loop, a large lesion), the lesion's contrast
# where something shows on this slice only (a 2-5 mm lesion on 3-5 mm slices). The gain
# puts a faint lesion (1.5-3x the ~12 HU noise in a 400 HU window) near tanh(1.1-2.2).
NEIGHBOUR_GAIN = 25.0
NEIGHBOUR_SMOOTH = 3


class NeighbourDifference(nn.Module):
    """Channels out: the middle slice's :class:`LocalContrast` channels, then the two
    neighbour-difference channels (input: previous, this, next slice)."""

    def __init__(self, contrast: LocalContrast) -> None:
        super().__init__()
        self.contrast = contrast

    @property
    def channels(self) -> int:
        return self.contrast.channels + 2

    @staticmethod
    def differences(x: torch.Tensor, gain: float, smoothed: torch.Tensor | None = None) -> list[torch.Tensor]:
        """tanh(gain · (box3(neighbour) − box3(slice))) for the previous and the next slice
        of a (previous, this, next) input; ``smoothed``: ``box_mean(x, NEIGHBOUR_SMOOTH)``
        when the caller has it already (the three slices in one pool)."""
        b = box_mean(x, NEIGHBOUR_SMOOTH) if smoothed is None else smoothed
        return [torch.tanh(gain * (b[:, k : k + 1] - b[:, 1:2])) for k in (0, 2)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = box_mean(x, NEIGHBOUR_SMOOTH)
        same = self.contrast.smooth == NEIGHBOUR_SMOOTH  # the contrast channel's smoothing is this one
        return torch.cat([self.contrast(x[:, 1:2], b[:, 1:2] if same else None),
                          *self.differences(x, NEIGHBOUR_GAIN, b)], dim=1)


# CT in two windows (``two_windows``): the input is the slices in one fixed wide window
# (the spec's ``fixed_window``), and the graph cuts the soft-tissue window out of it for
# the channels above, and keeps the wide one beside them. In the soft-tissue window
# (-160..240 HU) a phantom lung nodule (-260..-40 HU in -860 HU lung) is clipped to
# nothing or nearly so, while the lung vessels it must be told from (40 HU) show; in
# the wide window (-1000..500 HU) both show, the nodule a third dimmer, and the vessel
# runs on through the neighbouring slices where the nodule ends.
WIDE_WINDOW = (-250.0, 1500.0)  # (center, width) HU: -1000..500
SOFT_WINDOW = (40.0, 400.0)  # the phantom's soft-tissue VOI window, which the 2.x models read
WIDE_GAIN = 5.0  # a lung nodule's 600-820 HU step is 0.4-0.55 of the wide window: tanh(2-2.7)


class TwoWindows(nn.Module):
    """Input: the slice, or previous, this and next slice (``slices=3``), in
    :data:`WIDE_WINDOW` (0..1). Channels out: :class:`LocalContrast`'s (with ``slices=3``
    :class:`NeighbourDifference`'s) on the soft-tissue window cut from it, then this slice
    in the wide window (and with ``slices=3`` the two neighbour differences there, gain
    :data:`WIDE_GAIN`; with ``slice_mean`` also the local contrast of the three slices'
    mean in the soft-tissue window, last). The two windows are a buffer, so they travel
    with the weights; so does ``slice_mean``, a buffer present only when it is on.

    Why the mean (nineteenth session): a faint lesion on three slices has sqrt(3) times
    its single-slice contrast-to-noise ratio in their mean, and the neighbour differences
    (~0 where a lesion goes on through the slices) carry it only through tanh. On paper
    it was worth 4-7 points of CT lesions >= 5 mm; the lite UNets trained with it found
    fewer on the validation series, so no shipped model has it (docs/models-log.md)."""

    def __init__(self, contrast: LocalContrast, wide: tuple[float, float] = WIDE_WINDOW,
                 soft: tuple[float, float] = SOFT_WINDOW, slices: int = 3, slice_mean: bool = False) -> None:
        super().__init__()
        if slices not in (1, 3):
            raise ValueError(f"slices must be 1 or 3, got {slices}")
        if slice_mean and slices != 3:
            raise ValueError("slice_mean needs slices=3")
        self.slices = slices
        self.contrast = contrast
        self.inner: nn.Module = NeighbourDifference(contrast) if slices == 3 else contrast
        self.register_buffer("windows", torch.tensor([*wide, *soft], dtype=torch.float32))
        if slice_mean:
            self.register_buffer("slice_mean", torch.ones(1))
        self.mean = slice_mean
        lo_wide, lo_soft = wide[0] - wide[1] / 2.0, soft[0] - soft[1] / 2.0
        self.offset, self.scale = (lo_soft - lo_wide) / wide[1], wide[1] / soft[1]

    @property
    def channels(self) -> int:
        return self.inner.channels + (3 if self.slices == 3 else 1) + int(self.mean)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        soft = torch.clamp((x - self.offset) * self.scale, 0.0, 1.0)
        if self.slices == 1:
            return torch.cat([self.inner(soft), x], dim=1)
        out = [self.inner(soft), x[:, 1:2], *NeighbourDifference.differences(x, WIDE_GAIN)]
        if self.mean:  # the local-contrast channel of LocalContrast, on the three slices' mean
            out.append(self.contrast(soft.mean(dim=1, keepdim=True))[:, 1:2])
        return torch.cat(out, dim=1)


class LocalContrastUNet(nn.Module):
    """A MONAI UNet fed :class:`LocalContrast` (two channels, three with the edge channel);
    ``slices=3`` takes three slices and adds :class:`NeighbourDifference`'s two channels;
    ``two_windows`` (with ``slices=3``) takes them in a wide window (:class:`TwoWindows`)."""

    def __init__(self, variant: str, edge: bool = False, slices: int = 1, two_windows: bool = False,
                 windows: tuple[tuple[float, float], tuple[float, float]] = (WIDE_WINDOW, SOFT_WINDOW),
                 slice_mean: bool = False) -> None:
        super().__init__()
        if slice_mean and not (two_windows and slices == 3):
            raise ValueError("slice_mean needs two_windows and slices=3")
        if slices not in (1, 3):
            raise ValueError(f"slices must be 1 or 3, got {slices}")
        edge_gain = EDGE_GAIN if edge else 0.0
        from monai.networks.nets import UNet

        self.slices = slices
        self.contrast = LocalContrast(smooth=CONTRAST_SMOOTH.get(variant, 1), edge_gain=edge_gain)
        front: nn.Module
        if two_windows:
            front = TwoWindows(self.contrast, *windows, slices=slices, slice_mean=slice_mean)
        else:
            front = NeighbourDifference(self.contrast) if slices == 3 else self.contrast
        self.front = front if slices == 3 or two_windows else None
        self.unet = UNet(spatial_dims=2, in_channels=front.channels, out_channels=1, **UNET_VARIANTS[variant])

    # The fixed front (box means, tanh(gain · difference)) amplifies differences of a few
    # thousandths by 25-200: in half precision (spacing ~5e-4 near 1.0) that is noise of
    # ~0.1 per pixel, and an fp16 copy flipped 13 % of a crop's lesion pixels. So it runs in
    # the input's float32, and only the UNet in its weights' precision (see fp32_input).
    fp32_input = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.front(x) if self.front is not None else self.contrast(x)
        return self.unet(features.to(_weight_dtype(self.unet)))


def build_unet(variant: str, local_contrast: bool = True, edge: bool | None = None, slices: int = 1,
               two_windows: bool = False,
               windows: tuple[tuple[float, float], tuple[float, float]] = (WIDE_WINDOW, SOFT_WINDOW),
               slice_mean: bool = False) -> nn.Module:
    """The UNet of ``variant``; ``local_contrast=False`` is the plain one-channel MONAI
    UNet of the 1.x models (trained on CT only); ``edge`` adds the edge channel (default:
    :data:`EDGE_CHANNEL`); ``slices=3`` makes it 2.5-D (:class:`NeighbourDifference`),
    and ``two_windows`` reads those slices in a wide window (:class:`TwoWindows`), with
    ``slice_mean`` also their mean's local contrast."""
    if local_contrast:
        return LocalContrastUNet(variant, EDGE_CHANNEL.get(variant, False) if edge is None else edge, slices,
                                 two_windows, windows, slice_mean)
    from monai.networks.nets import UNet

    return UNet(spatial_dims=2, in_channels=1, out_channels=1, **UNET_VARIANTS[variant])


class Ensemble(nn.Module):
    """Segmentation networks with the same input in one graph, their logits averaged.

    lesion_unet_lite 4.0 is two of them: members trained with different recipes mark
    partly different false lesions and mostly the same true ones, so their mean logit
    moved the validation operating curve, where every single-network change
    (thresholds, losses, drawn-in lesions) had only moved along it; held out the gain
    was smaller (docs/models-log.md, fifteenth session). The state dict is the
    members' under ``members.<i>.``; :func:`network_for` rebuilds it."""

    def __init__(self, members: list[nn.Module]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        slices = {getattr(m, "slices", 1) for m in members}
        if len(slices) != 1:
            raise ValueError(f"the members take different numbers of slices: {sorted(slices)}")
        self.members = nn.ModuleList(members)
        self.slices = slices.pop()
        # each member casts to its weights' precision after its own fixed front
        self.fp32_input = all(getattr(m, "fp32_input", False) for m in members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.members[0](x)
        for member in self.members[1:]:
            out = out + member(x)
        return out / len(self.members)


def _windows(buffer: torch.Tensor) -> tuple[tuple[float, float], tuple[float, float]]:
    """A TwoWindows ``windows`` buffer as its ((wide centre, width), (soft centre, width))."""
    return (float(buffer[0]), float(buffer[1])), (float(buffer[2]), float(buffer[3]))


def network_for(name: str, state: dict[str, torch.Tensor], roi: bool | None = None) -> nn.Module:
    """The network that saved ``state`` (a shipped ``.pt``), with the weights loaded:
    with or without the local-contrast and edge inputs, as the weights say. ``roi``: a
    RoiNet (default: when ``name`` starts with ``roi_classifier``). Weights saved under
    ``members.<i>.`` make an :class:`Ensemble` of the networks each member's weights say."""
    members = sorted({int(k.split(".")[1]) for k in state if k.startswith("members.")})
    if members:
        return Ensemble([network_for(name, {k[len(f"members.{i}."):]: v for k, v in state.items()
                                            if k.startswith(f"members.{i}.")}, roi) for i in members]).eval()
    first = next(v for k, v in state.items() if k.endswith(".weight") and v.ndim == 4)
    channels = first.shape[1]  # 1: the frame; 2: + local contrast; 3: + edge; 2.5-D: two more
    if name.startswith("roi_classifier") if roi is None else roi:
        both = state["presence.weight"].shape[1] == 2 * state["heatmap.weight"].shape[1]
        win = state.get("features.0.windows")  # TwoWindows
        if win is not None:  # 2-D: 2 contrast channels + 1 wide; 2.5-D: 4 + 3
            slices = 3 if channels >= 7 else 1
            net: nn.Module = RoiNet(pool="mean+max" if both else "max", slices=slices, two_windows=True,
                                    windows=_windows(win))
        else:
            slices = 3 if channels >= 4 else 1
            net = RoiNet(local_contrast=channels >= 2, edge=channels - (2 if slices == 3 else 0) == 3,
                         pool="mean+max" if both else "max", slices=slices)
    else:
        win = state.get("front.windows")  # TwoWindows: its two windows, and more channels
        mean = "front.slice_mean" in state  # TwoWindows with the slices' mean: one more
        slices = (3 if channels >= 7 else 1) if win is not None else (3 if channels >= 4 else 1)
        extra = (2 if slices == 3 else 0) + ((3 if slices == 3 else 1) if win is not None else 0) + int(mean)
        net = build_unet(name, local_contrast=any(k.startswith("unet.") for k in state),
                         edge=channels - extra == 3, slices=slices, two_windows=win is not None,
                         **({"windows": _windows(win), "slice_mean": mean} if win is not None else {}))
    net.load_state_dict(state)
    return net.eval()


def _conv_bn(cin: int, cout: int, k: int = 3, s: int = 1, groups: int = 1, dilation: int = 1) -> nn.Sequential:
    pad = dilation * (k - 1) // 2
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, s, pad, dilation=dilation, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(inplace=True),
    )


class _DepthwiseSeparable(nn.Sequential):
    """MobileNet's block: a 3×3 depthwise convolution, then a 1×1 pointwise one."""

    def __init__(self, cin: int, cout: int, stride: int = 1, dilation: int = 1) -> None:
        super().__init__(_conv_bn(cin, cin, 3, stride, groups=cin, dilation=dilation), _conv_bn(cin, cout, 1))


class RoiNet(nn.Module):
    """A MobileNet-style ROI classifier on the frame thumbnail.

    Depthwise-separable blocks with channel counts in multiples of 8 bring the
    thumbnail to 1/8 resolution; dilated blocks then widen the context. Two heads:
    ``heatmap`` (a lesion logit per 8×8-pixel cell of the thumbnail) and
    ``presence`` (one frame-level logit from average- and max-pooled features).

    ``pool="max"`` drops the average: the mean of a frame with one small lesion falls as
    the frame grows, and the shipped CT classifier (trained on 256² windows) never calls
    a whole 512² slice present at 0.5; its heatmap does the work. A CT classifier with
    max pooling trained 28 minutes (one thread) called more lesion-free slices negative
    at the same coverage but never covered more than 83 % of the validation lesions at
    any threshold (the shipped one: 96 % at heatmap 0.3), so it was not shipped.
    """

    def __init__(self, width: int = 32, local_contrast: bool = True, edge: bool = False,
                 pool: str = "mean+max", slices: int = 1, two_windows: bool = False,
                 windows: tuple[tuple[float, float], tuple[float, float]] = (WIDE_WINDOW, SOFT_WINDOW)) -> None:
        super().__init__()
        if pool not in ("max", "mean+max"):
            raise ValueError(f'pool must be "max" or "mean+max", got {pool!r}')
        if slices not in (1, 3) or (slices == 3 and not local_contrast):
            raise ValueError(f"slices must be 1, or 3 with local_contrast, got {slices}")
        w, self.pool, self.slices = width, pool, slices
        # Radiograph nodules are faint against ribs: see LocalContrast (the 1.x model has none).
        if local_contrast:
            contrast = LocalContrast(edge_gain=EDGE_GAIN if edge else 0.0)
            # 2.5-D (2.0): the neighbouring slices' difference channels, as in the UNets;
            # no parameters, so the layer numbering (and older weights) stay as they were
            first: nn.Module = NeighbourDifference(contrast) if slices == 3 else contrast
            if two_windows:  # CT in one wide window, the soft-tissue one cut from it (3.x)
                first = TwoWindows(contrast, *windows, slices=slices)
            front = [first, _conv_bn(first.channels, 16, 3, 2)]
        else:
            front = [_conv_bn(1, 16, 3, 2)]
        self.features = nn.Sequential(
            *front,  # /2
            _DepthwiseSeparable(16, 24),
            _DepthwiseSeparable(24, w, stride=2),  # /4
            _DepthwiseSeparable(w, w),
            _DepthwiseSeparable(w, 2 * w, stride=2),  # /8
            _DepthwiseSeparable(2 * w, 2 * w),
            _DepthwiseSeparable(2 * w, 2 * w, dilation=2),
            _DepthwiseSeparable(2 * w, 2 * w, dilation=4),
        )
        self.heatmap = nn.Conv2d(2 * w, 1, 1)
        self.presence = nn.Linear((4 if pool == "mean+max" else 2) * w, 1)

    @property
    def fp32_input(self) -> bool:
        """True when the first layer is the fixed local-contrast front, which stays in
        float32 under a half-precision copy (see :class:`LocalContrastUNet`)."""
        return isinstance(self.features[0], (LocalContrast, NeighbourDifference, TwoWindows))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fp32_input:
            f = self.features[1:](self.features[0](x).to(_weight_dtype(self.features[1])))
        else:
            f = self.features(x)
        heat = self.heatmap(f)
        pooled = f.amax(dim=(2, 3))
        if self.pool == "mean+max":
            pooled = torch.cat([f.mean(dim=(2, 3)), pooled], dim=1)
        return self.presence(pooled), heat
