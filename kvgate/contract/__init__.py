"""What kvgate's parts agree on, in one place below all of them: the Envoy names and ring
constants that the xDS builders, ext_proc and the ring rebuild share (`envoy`), endpoint states
(`states`) and routing modes (`modes`).

Imports nothing from the project, so every package can import it (tests/unit/test_layering.py).
"""
