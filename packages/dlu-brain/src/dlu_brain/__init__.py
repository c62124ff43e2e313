"""DLU Brain."""
