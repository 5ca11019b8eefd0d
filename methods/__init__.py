"""One module per method; importing this package registers them all."""

from methods import ar, tr  # noqa: F401
