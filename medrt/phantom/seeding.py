"""Where every random number in the phantom comes from.

Each part of a phantom (series build, lesions, one frame's noise) draws from its own
generator, keyed by ``(seed, kind, stream, index)``. So turning lesions off, or
asking for fewer frames, leaves the other parts unchanged, and the same seed gives
the same pixels on every run.
"""

from __future__ import annotations

import numpy as np

__all__ = ["KIND_CODE", "stream_rng", "check_seed"]

KIND_CODE = {"ct": 1, "xray": 2}


def check_seed(seed: int) -> int:
    """Return ``seed`` as an int, or raise ValueError naming the argument."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f'Argument "seed" must be a non-negative integer, got {seed!r}.')
    return int(seed)


def stream_rng(seed: int, kind: str, *parts: int) -> np.random.Generator:
    """The generator for one part of one phantom: ``(seed, kind, *parts)`` -> PCG64."""
    return np.random.default_rng([check_seed(seed), KIND_CODE[kind], *map(int, parts)])
