"""One module per runtime, each behind :class:`medrt.engine.backends.base.Backend`."""
