"""EAGLE-2: the drafter with its dynamic tree, and the one-layer draft head."""
