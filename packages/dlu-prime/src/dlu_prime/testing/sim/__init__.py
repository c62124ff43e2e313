"""A deterministic simulation of a job's world for the PrimeManager's decision code: a simulated
cluster (nodes, actors, SubMasters, Ray reconstructing actors), a simulated state store (delays,
hangs, lost replies, late writes) and a fake clock, driven single-threaded by one seeded
generator of faults, with invariants checked after every step (`runner.run_seed`)."""
