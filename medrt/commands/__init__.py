"""One module per ``medrt`` sub-command; each exposes ``register(subparsers)``."""
