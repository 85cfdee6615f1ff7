"""hsched: one intelligent queue for a small heterogeneous fleet of GPU machines."""

__version__ = "0.1.0"
__all__ = ["__version__"]
