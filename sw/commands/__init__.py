"""Subcommands of the ``mcf`` command line; each module has ``register(subparsers)``."""
