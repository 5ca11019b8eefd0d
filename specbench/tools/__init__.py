"""Research tools that no run needs: the device-sync audit, the kernel profile, the tree tuning."""
