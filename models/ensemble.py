"""Combine trained segmentation networks into one model: one ONNX graph whose logits
are the mean of theirs, one ``.pt``, one spec.

    OMP_NUM_THREADS=1 python -m medrt.models.train lesion_unet_lite ... --out m0 &
    OMP_NUM_THREADS=1 python -m medrt.models.train lesion_unet_lite ... --out m1; wait
    python -m medrt.models.ensemble lesion_unet_lite m0 m1 --out models --version 4.0.0 --threshold 0.9

Each member directory holds what ``models/train.py`` wrote (``<name>.pt``, ``.onnx``,
``.toml``). The members must read the same input the same way (normalisation, slices,
spacing, modalities, inputs and outputs); the combined spec keeps those, records every
member's training command, time and details, and takes the wall time of the members
trained side by side, one per core, as its training time. Averaging logits, not
probabilities: a member sure of background (logit -15) outvotes one unsure of a lesion
(+2), which is what the ensemble is for; and it is one Add per member in the graph.

The export is :func:`medrt.models.train.export`'s (the CPU-friendly rewrite, checked
against torch), so every backend runs the ensemble as it runs a single network:
ONNX Runtime and TensorRT from the ONNX graph, torch CUDA from the ``.pt``
(:func:`medrt.models.networks.network_for` rebuilds the members).
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from medrt.engine.quantize import dump_spec
from medrt.engine.registry import load_spec, sha256_file
from medrt.models.networks import Ensemble, network_for
from medrt.models.train import ENSEMBLE_NOTE, EXPORT_NOTE, export

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

log = logging.getLogger("medrt.models.ensemble")

# What the members must share: the analyzer prepares one input for the whole graph.
SAME_MODEL = ("task", "multiple_of", "modalities", "body_parts", "views", "planes", "slices", "neighbour_mm",
              "spacing_mm")
SAME_TABLES = ("normalization", "inputs", "outputs")


def member_specs(name: str, dirs: list[Path]) -> list[dict[str, Any]]:
    """Each member's spec document (its file's sha256 checked), refused with a message
    naming the member when it is not a ``name`` segmenter or reads its input differently."""
    docs = []
    for d in dirs:
        path = d / f"{name}.toml"
        if not path.is_file() or not (d / f"{name}.pt").is_file():
            raise SystemExit(f"{d}: no {name}.toml and {name}.pt (train the member with models/train.py --out {d})")
        if load_spec(path).task != "segmentation":  # load_spec refuses a file whose sha256 differs
            raise SystemExit(f"{path}: only segmentation networks can be combined (one logit map per pixel)")
        docs.append(tomllib.loads(path.read_text(encoding="utf-8")))
    first = docs[0]
    for d, doc in zip(dirs[1:], docs[1:], strict=True):
        for key in SAME_MODEL:
            if doc["model"].get(key) != first["model"].get(key):
                raise SystemExit(f"{d}: [model] {key} = {doc['model'].get(key)!r}, but {dirs[0]} has "
                                 f"{first['model'].get(key)!r}; the members must read the same input")
        for key in SAME_TABLES:
            if doc.get(key) != first.get(key):
                raise SystemExit(f"{d}: its [{key}] differs from {dirs[0]}'s; the members must read the same input")
    return docs


def combine(name: str, dirs: list[Path]) -> Ensemble:
    """The :class:`Ensemble` of the members' saved weights."""
    members = [network_for(name, torch.load(d / f"{name}.pt", map_location="cpu", weights_only=True)) for d in dirs]
    return Ensemble(members).eval()


def ensemble_spec(name: str, onnx_path: Path, docs: list[dict[str, Any]], version: str,
                  threshold: float | None, threshold_note: str, command: str,
                  confirm: float | None = None) -> dict[str, Any]:
    """The combined spec document: the members' shared fields, the new file, version and
    thresholds (``confirm``: the fine sweep's confirmation, for a radiograph segmenter),
    and each member's training record."""
    first = docs[0]
    model = {**first["model"], "version": version, "file": onnx_path.name, "sha256": sha256_file(onnx_path),
             "card": f"{name}.md",
             "export": f"{EXPORT_NOTE}; {ENSEMBLE_NOTE.format(n=len(docs))}",
             "members": len(docs),
             "description": f"{len(docs)} networks in one graph, their logits averaged (models/networks.py "
                            f"Ensemble), each: {first['model']['description']}"}
    thresholds = dict(first.get("thresholds", {}))
    if threshold is not None:
        thresholds["probability"] = threshold
    if confirm is not None:
        thresholds["confirm"] = confirm
    trainings = [doc.get("training", {}) for doc in docs]
    training = {
        "data": trainings[0].get("data", "?"),
        "command": command,
        # side by side, one member per core: the machine's time is the longest member's
        "seconds": max(float(t.get("seconds", 0)) for t in trainings),
        "machine": f"{platform.machine()}, each member on one thread (side by side: one per core), "
                   f"torch {torch.__version__}",
        "member_commands": [str(t.get("command", "?")) for t in trainings],
        "member_seconds": [float(t.get("seconds", 0)) for t in trainings],
        "member_details": [str(t.get("details", "{}")) for t in trainings],
        "member_sha256": [str(doc["model"]["sha256"]) for doc in docs],
    }
    if threshold_note:
        training["thresholds"] = threshold_note
    return {"model": model, **{k: first[k] for k in SAME_TABLES if k in first}, "thresholds": thresholds,
            "training": training}


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m medrt.models.ensemble`` (tests/test_docs_commands.py parses the
    docs' commands with it)."""
    p = argparse.ArgumentParser(prog="python -m medrt.models.ensemble", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the members' model name (e.g. lesion_unet_lite)")
    p.add_argument("members", nargs="+", type=Path, help="directories with each member's .pt, .onnx and .toml")
    p.add_argument("--out", type=Path, default=Path("models"))
    p.add_argument("--version", required=True, help="the combined model's version")
    p.add_argument("--threshold", type=float, default=None,
                   help="its probability threshold (default: the first member's), chosen on validation phantoms")
    p.add_argument("--confirm", type=float, default=None,
                   help="the fine sweep's confirmation on flipped views (radiograph segmenters; "
                        "default: the first member's, else medrt.analysis.sweep's), chosen on validation phantoms")
    p.add_argument("--threshold-note", default="", help="how the threshold was chosen, for the spec and the card")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if len(args.members) < 2:
        p.error("an ensemble needs at least two members")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    docs = member_specs(args.model, args.members)
    net = combine(args.model, args.members)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), args.out / f"{args.model}.pt")
    onnx_path = export(net, args.model, args.out, roi=False)
    one_thread = [c if c.startswith("OMP_NUM_THREADS=") else f"OMP_NUM_THREADS=1 {c}"
                  for c in (str(d.get("training", {}).get("command", "?")) for d in docs)]
    command = (" & ".join(f"{c} --out m{i}" for i, c in enumerate(one_thread))
               + f"; wait; python -m medrt.models.ensemble {args.model} "
               + " ".join(f"m{i}" for i in range(len(docs))) + f" --out {args.out} --version {args.version}"
               + (f" --threshold {args.threshold:g}" if args.threshold is not None else "")
               + (f" --confirm {args.confirm:g}" if args.confirm is not None else ""))
    doc = ensemble_spec(args.model, onnx_path, docs, args.version, args.threshold, args.threshold_note, command,
                        args.confirm)
    spec = onnx_path.with_suffix(".toml")
    spec.write_text(dump_spec(doc, f"# {args.model} {args.version}: written by python -m medrt.models.ensemble. "
                                   "Format: models/README.md"), encoding="utf-8")
    load_spec(spec)
    log.info("wrote %s and %s (%d members)", onnx_path, spec, len(docs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
