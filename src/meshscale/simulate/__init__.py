"""meshscale simulate layer."""
