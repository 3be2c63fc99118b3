"""Neural-network building blocks (``kiln.nn.functional``)."""
from . import functional

__all__ = ["functional"]
