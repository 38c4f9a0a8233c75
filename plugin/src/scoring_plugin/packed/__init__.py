"""The packed accelerator: every pair of a call in one engine request, attention kept inside
each pair, a causal reranker's shared prompt head computed once.

The shared machinery is here (the packing plan, pair attention, the layer and whole-step
graphs, the kernel choices made at start-up); each model family that is served packed lives
in :mod:`scoring_plugin.packed.families` and declares only what differs from the others.
"""
