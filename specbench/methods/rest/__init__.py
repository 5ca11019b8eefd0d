"""REST: the drafter and its datastore (suffix arrays over a token corpus)."""
