"""Context parallelism's attention: the kernels each rank runs and what its exchange of keys and values leaves
exposed, by how the framework runs it (`CP_METHODS`). Each rank holds S / cp of every sequence's tokens (L), in
two chunks r and 2 cp - 1 - r of 2 cp (the head-tail load balance of torch's context_parallel, Llama 3's and
Transformer Engine's), so every rank does the same share of the causal work.

- masked (meshscale train, train/parallel/apply.py): K and V all-gathered over the cp group (their gradients
  reduce-scattered in backward), then one SDPA call of the rank's L queries against all S keys with a boolean
  mask of the positions. A kernel given an arbitrary mask cannot skip the blocks the causal order would: it
  computes every one of the L x S scores (twice the rank's causal share) and reads the mask as an additive bias
  (built and converted once per call: the comparison written as bytes, then SDPA's conversion of a boolean mask
  to an additive one in the compute precision; the kernel reads it once, L2 serving the heads).
- allgather, alltoall: torch's context_parallel (torch/distributed/tensor/experimental/_attention.py,
  `_templated_ring_attention`, its backward, `_SDPAMerger`), as torchtitan runs it
  (context_parallel_rotate_method). cp rounds per layer: round 0 the local chunks causally (L x L); each later
  round the other half of the work (L queries x L / 2 keys, or L / 2 x L) without a mask, each its own SDPA
  kernel, its result merged into the running output in fp32 (the output cast up, out - sigmoid(lse' - lse) x
  (out - out'), the partial chunk written back by a cat: about CP_MERGE_BYTES per output element a round), and
  K and V packed for the next rank (a cat). Backward runs the rounds again with the kernels' backward, adding
  each round's gradients into fp32 accumulators (dq += dq'; the dK/dV received, added to and packed for the next
  rank: CP_ACCUMULATE_Q_BYTES and CP_ACCUMULATE_KV_BYTES per element a round). allgather (the default rotate
  method): one all-gather of K and V, issued before round 0 and waited at round 1 (hidden behind round 0's
  kernel), again in backward; the gradients of K and V travel the ring in fp32 (the backward's dkv rotater is
  always all-to-all), each hop hidden behind the next round's kernel, the last one waited after the loop.
  alltoall: K and V travel the ring too, one hop per round, each behind that round's kernel.
- p2p: Transformer Engine's ring (AttnFuncWithCPAndKVP2P, Megatron's cp_comm_type p2p): the same rounds, K/V
  hops overlapped with each round's kernel, the output and gradient corrections fused kernels
  (CP_FUSED_CORRECTION_BYTES an element a round).

The kernels' rate is the attention kernel's at its round's shape: a round of q x k keys is priced at the
length of the square of the same area, sqrt(q x k), without the causal mask where it has none.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import sqrt

from meshscale.predict.training.kernels import Kernel, memory_op

CP_METHODS = ("masked", "allgather", "alltoall", "p2p")
# torch's _SDPAMerger per output element and round, fp32: the round's output cast up (2 + 4 B), out - out'
# (4 + 4 + 4), x sigmoid(...) (4 + 4), out - (...) (4 + 4 + 4), the partial update's cat (4 + 4): 42 B
CP_MERGE_BYTES = 42.0
CP_MERGE_OPS = 9
# torch's ring backward per element and round: dq += dq' (fp32 + bf16 -> fp32: 10 B); dK and dV: the received
# fp32 buffer sliced and added to (10 B), packed by a cat for the next rank (8 B)
CP_ACCUMULATE_Q_BYTES, CP_ACCUMULATE_KV_BYTES = 10.0, 18.0
CP_ACCUMULATE_OPS = 8
# Transformer Engine's fused corrections: the fp32 accumulator read and written, the round's result read
CP_FUSED_CORRECTION_BYTES = 4.0 + 4.0 + 2.0


@dataclass(frozen=True)
class CpShape:
    """One rank's share of a micro-batch's attention: ``sequences`` of S tokens, ``local`` L = S / cp of each."""

    sequences: float
    seq_len: int
    cp: int
    q_width: float      # this rank's query (and output) width: heads / tp x head_dim
    kv_width: float     # ... of keys and of values: kv heads / tp x head_dim
    head_dim: int
    e: int              # bytes of an activation element
    pair_flops: float = 0.0   # FLOPs of one query against one key over the rank's heads (0: 4 x q_width)

    @property
    def local(self) -> float:
        return self.seq_len / self.cp

    def scores(self, q: float, k: float) -> float:
        """FLOPs of q queries against k keys per sequence, all heads of the rank: QK^T and PV."""
        return (self.pair_flops or 4.0 * self.q_width) * q * k * self.sequences

    def io(self, q: float, k: float) -> float:
        """Q and O of q tokens, K and V of k tokens, once through HBM."""
        return self.e * self.sequences * (2 * q * self.q_width + 2 * k * self.kv_width)


def cp_attention_kernels(s: CpShape, method: str) -> tuple[list[Kernel], list[Kernel]]:
    """(forward kernels, backward-only kernels) of one layer's attention on one rank under context parallelism
    (see the module's docstring); each attention kernel carries its length (m) and head dimension (k)."""
    L, S = s.local, s.seq_len
    if method == "masked":
        mask = memory_op("CP mask", (1 + 1 + s.e) * L * S, 0.0, ops=3)     # <=, and its conversion to a bias
        attention = Kernel("attention", "attention", s.scores(L, S), s.io(L, S) + s.e * L * S, m=S, k=s.head_dim,
                           causal=False)
        return [mask, attention], []
    rounds = s.cp - 1
    first = Kernel("attention", "attention", s.scores(L, (L + 1) / 2), s.io(L, L),
                   m=int(L), k=s.head_dim)
    ring = Kernel("attention (ring round)", "attention", s.scores(L, L / 2), s.io(L, L / 2) * 0.75,
                  m=int(L / sqrt(2)), k=s.head_dim, count=rounds, causal=False)
    q_elements, kv_elements = s.sequences * L * s.q_width, s.sequences * L * s.kv_width
    if method == "p2p":
        merge = memory_op("CP output correction", CP_FUSED_CORRECTION_BYTES * q_elements, 0.0)
        accumulate = memory_op("CP gradient accumulation",
                               CP_FUSED_CORRECTION_BYTES * (q_elements + 2 * kv_elements))
        return [first, ring, _times(merge, rounds)], [_times(accumulate, s.cp)]
    merge = memory_op("CP merge", CP_MERGE_BYTES * q_elements, 0.0, ops=CP_MERGE_OPS)
    pack = memory_op("CP K/V pack", 2 * s.e * 2 * kv_elements, 0.0)
    result = memory_op("CP merged output cast", (4 + s.e) * q_elements, 0.0, ops=2)
    accumulate = memory_op("CP gradient accumulation", CP_ACCUMULATE_Q_BYTES * q_elements
                           + CP_ACCUMULATE_KV_BYTES * 2 * kv_elements, ops=CP_ACCUMULATE_OPS)
    return [_times(pack, rounds), first, ring, _times(merge, rounds), result], [_times(accumulate, s.cp)]


def _times(kernel: Kernel, n: int) -> Kernel:
    from dataclasses import replace
    return replace(kernel, count=max(0, n))


def kv_bytes(s: CpShape) -> float:
    """This rank's K and V of one micro-batch (what one hop of the ring moves, in the activations' precision)."""
    return 2 * s.e * s.sequences * s.local * s.kv_width


def ring_exposed_s(method: str, rounds_s: list[float], gather_s: float, hop_s: float, grad_hop_s: float,
                   backward: bool) -> float:
    """What one layer's exchange of K and V (and in backward of their gradients) adds to its attention, given
    each round's kernel time (``rounds_s``, round 0 first), the all-gather of every rank's K and V
    (``gather_s``), one hop of K and V around the ring (``hop_s``) and of their fp32 gradients
    (``grad_hop_s``)."""
    if len(rounds_s) < 2:
        return 0.0
    if method == "allgather":
        exposed = max(0.0, gather_s - rounds_s[0])
    else:   # a hop per round, each behind that round's kernel
        exposed = sum(max(0.0, hop_s - t) for t in rounds_s[:-1])
    if backward:   # the gradients' hop of round i waits behind round i + 1; the last after the loop
        exposed += sum(max(0.0, grad_hop_s - t) for t in rounds_s[1:]) + grad_hop_s
    return exposed
