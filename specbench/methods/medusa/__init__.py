"""Medusa: the drafter and its heads (their checkpoint format, shared with EAGLE: specbench/drafting/checkpoint.py)."""
