"""Medusa: the drafter, its heads and their checkpoint format (shared with EAGLE)."""
