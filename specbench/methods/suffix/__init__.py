"""Suffix structures and the methods that draft from them: Suffix Decoding (suffix trees) and
SAM-Decoding (suffix automata)."""
