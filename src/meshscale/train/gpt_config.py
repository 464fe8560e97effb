"""A GPT's shape and what follows from it (parameters, FLOPs), apart from the module itself so that the model
registry, and the predictions that read it, need no torch."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GPTConfig:
    n_layer: int
    n_head: int
    d_model: int
    vocab_size: int
    seq_len: int


def gpt_params(cfg: GPTConfig) -> int:
    """Parameter count: embeddings (head tied), 12 d^2 + 13 d per block, final norm."""
    d = cfg.d_model
    return cfg.vocab_size * d + cfg.seq_len * d + cfg.n_layer * (12 * d * d + 13 * d) + 2 * d


def gpt_flops(cfg: GPTConfig) -> float:
    """Forward + backward FLOPs per sequence: 6 x (params doing matmuls) x tokens + attention 12 L d T^2
    (Kaplan et al. / PaLM appendix B; the tied head counts once, position embeddings do no matmul)."""
    t = cfg.seq_len
    matmul_params = gpt_params(cfg) - cfg.seq_len * cfg.d_model
    return 6.0 * matmul_params * t + 12.0 * cfg.n_layer * cfg.d_model * t * t
