"""The PrimeMaster actor and its PrimeManager: stages, monitoring, persisted state."""
