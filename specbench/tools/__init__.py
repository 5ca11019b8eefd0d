"""Research tools that no run needs, for scripts and tests only: the device-sync audit and the kernel profile."""
