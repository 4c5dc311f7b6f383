"""One module per ``trainguard`` sub-command; each exposes ``register(subparsers)``.

Handlers import the layers they need inside the function, so that listing the
commands imports nothing heavy.
"""
