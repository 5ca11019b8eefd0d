"""specbench: a harness for lossless speculative decoding."""

__version__ = "0.1.0"
