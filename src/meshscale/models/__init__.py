"""What a model is, independent of any engine: transformer shapes (presets and Hugging Face config files), the
parallel layout a run uses, and the memory that layout needs by the model's own arithmetic. No torch here:
`predict` reads these without importing an engine, `train` builds modules from them."""
from meshscale.models.layout import ParallelLayout
from meshscale.models.transformer import TransformerConfig, load_model_config, preset_names

__all__ = ["ParallelLayout", "TransformerConfig", "load_model_config", "preset_names"]
