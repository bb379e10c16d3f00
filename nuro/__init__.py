"""nuro: a multi-tenant ML training platform layered on Slurm (core library)."""

__version__ = "0.1.0"
