"""AnchorMass: fixed-size-KV-cache long-context language models and their matched baseline."""

__version__ = "0.1.0"
