"""`kvgate bench`: the workload through a real gateway (or through each routing mode of a fleet
it starts) and the shared outputs (JSON, markdown table, PNG chart) that `kvgate simulate` uses too.
"""
