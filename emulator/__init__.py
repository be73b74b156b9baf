"""Emulated vLLM engine fleet with vLLM prefix-cache semantics and a shared DDR KV pool.

Layers (one module, one job):

- pure model, no I/O, time passed in explicitly so a discrete-event simulator can drive it:
  :mod:`emulator.tokenize`, :mod:`emulator.prefix_cache`, :mod:`emulator.ddr_pool`,
  :mod:`emulator.timing`, :mod:`emulator.engine_model`;
- serving: :mod:`emulator.server` (one aiohttp app per instance), :mod:`emulator.pool_service`
  (the DDR pool over HTTP and the clients instances use), :mod:`emulator.fleet` (several instances
  and a pool in one process), :mod:`emulator.command` (``kvgate emulate``).
"""
