"""kvgate: session-affinity gateway for LLM inference fleets."""

__version__ = "0.1.0"
