"""meshscale predict layer."""
