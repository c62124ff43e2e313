"""DLU control plane on Ray: PrimeMaster, PrimeManager, scheduler and worker runtime."""

__version__ = "0.1.0"
