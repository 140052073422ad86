"""hetpp: Heterogeneous Pipeline Parallelism for training transformers on mixed GPU clusters."""

__version__ = "0.1.0"
