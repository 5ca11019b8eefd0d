"""Autoregressive decoding: the baseline every speedup is measured against."""

from specbench.drafter import Drafter
from specbench.registry import register


@register("ar")
class Autoregressive(Drafter):
    """Proposes nothing, so every step is one plain forward of the last token."""
