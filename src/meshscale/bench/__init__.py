"""meshscale bench layer."""
