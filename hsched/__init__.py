"""hsched: one intelligent queue for a small heterogeneous fleet of GPU machines."""

__version__ = "0.2.0"
__all__ = ["__version__"]
