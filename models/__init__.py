"""Shipped models: ONNX files, their ``*.toml`` specs and model cards.

Installed as ``medrt.models`` so that a non-editable install carries them;
:func:`medrt.models_dir` style lookups use ``importlib.resources``.
"""
