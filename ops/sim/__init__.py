"""A deterministic simulator of the meta cluster (issue 36, part 1, milestone 1): three real meta nodes (pysyncobj
driven by hand, Stator's journal over a simulated disk, Stator's transport over simulated sockets, the real state
machine, and each node's read path and group lease keeper) in one process and one thread, under one seeded
scheduler with virtual time. See ops/sim/run.py.
"""
