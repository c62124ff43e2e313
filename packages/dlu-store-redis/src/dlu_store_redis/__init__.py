"""Redis implementation of the DLU state store."""

__version__ = "0.1.0"
