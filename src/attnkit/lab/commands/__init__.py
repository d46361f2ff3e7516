"""Subcommands of the ``attnkit`` command line, one module per group.

Each module exposes ``add(subparsers)``: it adds its subparsers and sets
``func`` (``args -> exit code``) on each. :mod:`attnkit.lab.cli` lists the modules.
"""
