"""REST: retrieval-based speculative decoding (its datastore: specbench/drafting/datastore.py)."""
