"""Suffix Decoding, as vLLM ships it (its suffix trees: specbench/drafting/suffix_tree.py)."""
