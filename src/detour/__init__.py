"""detour: continued pretraining of encoders with a causal-LM detour, and the tools to prove it works.

    detour --help
"""

__version__ = "0.1.0"
