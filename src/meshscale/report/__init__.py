"""meshscale report layer."""
