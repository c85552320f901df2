"""Sluice: a Triton-compatible inference server whose requests travel through Redis.

The installed package is ``sluice``; its subpackages live in the repository's
top-level folders (``api/`` is ``sluice.api``, ``broker/`` is ``sluice.broker``, …),
mapped by ``pyproject.toml``, so installing Sluice adds one import name only.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
