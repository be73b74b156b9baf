"""Real vLLM (the CPU build) behind kvgate: its own environment, a tiny deterministic model, and
a fleet of engines pinned to cores; for end-to-end tests and the emulator's calibration."""
