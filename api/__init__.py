"""Sluice's front ends: KServe v2 HTTP (and gRPC), the CLI, the gateway process."""

__version__ = "0.1.0"
__all__ = ["__version__"]
