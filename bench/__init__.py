"""`kvgate bench`: the workload through a real gateway, or through each routing mode of a fleet
it starts (`--compare`); its results and reports are benchkit's, shared with `kvgate simulate`.
"""
