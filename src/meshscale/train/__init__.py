"""meshscale train layer."""
