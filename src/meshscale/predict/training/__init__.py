"""Training step time from the model's own arithmetic: every layer's kernels timed by a roofline on the GPU's
datasheet (or calibrated by a measured profile), every parallel dimension's collectives priced on the fabric
where the layout places its groups, memory by sharding and checkpointing, and a search over layouts.
Torch-free: `predict` answers without importing an engine."""
