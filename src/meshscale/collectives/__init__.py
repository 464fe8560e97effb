"""meshscale collectives layer."""
