"""Network definitions (torch; needs the ``train`` extra). Inference runs the ONNX exports."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["RoiNet", "build_unet", "UNET_VARIANTS"]

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


def build_unet(variant: str) -> nn.Module:
    from monai.networks.nets import UNet

    return UNet(spatial_dims=2, in_channels=1, out_channels=1, **UNET_VARIANTS[variant])


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
    """

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        w = width
        self.features = nn.Sequential(
            _conv_bn(1, 16, 3, 2),  # /2
            _DepthwiseSeparable(16, 24),
            _DepthwiseSeparable(24, w, stride=2),  # /4
            _DepthwiseSeparable(w, w),
            _DepthwiseSeparable(w, 2 * w, stride=2),  # /8
            _DepthwiseSeparable(2 * w, 2 * w),
            _DepthwiseSeparable(2 * w, 2 * w, dilation=2),
            _DepthwiseSeparable(2 * w, 2 * w, dilation=4),
        )
        self.heatmap = nn.Conv2d(2 * w, 1, 1)
        self.presence = nn.Linear(4 * w, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.features(x)
        heat = self.heatmap(f)
        pooled = torch.cat([f.mean(dim=(2, 3)), f.amax(dim=(2, 3))], dim=1)
        return self.presence(pooled), heat
