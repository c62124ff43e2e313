"""The worker actor and the loading of user entrypoints."""
