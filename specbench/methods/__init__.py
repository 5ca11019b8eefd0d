"""One module per method (a package for a method with helpers); importing this package registers
every method in it."""

import importlib
import pkgutil

for _mod in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
    importlib.import_module(_mod.name)
