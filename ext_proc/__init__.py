"""kvgate's ext_proc service: picks the engine for every request that carries a session."""
