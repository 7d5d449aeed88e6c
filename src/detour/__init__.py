"""detour: continued pretraining of encoders with a causal-LM detour, and the tools to prove it works.

    detour --help

Layers, lowest first; each imports only its own and the ones below (docs/architecture.md, kept by
tests/test_architecture.py):

    base (errors, io, paths, quiet, notices, config, runs, stop, lock, flags) < data < model < train
    < eval < analysis < report < study < cli
"""

__version__ = "0.1.0"
