"""Seeded, deterministic workloads for `kvgate bench` and `kvgate simulate`.

A workload is a list of requests in arrival order (emulated seconds). Each request's prompt is a
chain of *segments* (a key and a token count): the real benchmark turns segments into text that
the emulator's tokenizer cuts into exactly that many tokens; the simulator hashes the same segments
into the same block-sharing structure without materialising text.
"""

from workload.model import Request, Segment, Workload

__all__ = ["Request", "Segment", "Workload"]
