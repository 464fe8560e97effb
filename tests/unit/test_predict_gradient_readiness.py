"""When DDP's buckets can start: each gradient is complete after the backward of the layers from the output down to
its own (a tied embedding only after its last use), a bucket once all its gradients are; and the exchange time
left after compute when the buckets run one at a time from then. (The emulated two-node runs these predict are the
corpus of `meshscale validate --emulated`, tests/unit/test_validate_emulated.py.)"""
import random

import pytest

from meshscale.errors import MeshscaleError

from meshscale.predict.frameworks import FRAMEWORKS, ready_order
from meshscale.models.transformer import load_model_config
from meshscale.predict.gradient_tensors import GradientTensor, resnet50_gradients, transformer_gradients
from meshscale.predict.training.replicas import exposed_exchange_s

DDP = FRAMEWORKS["ddp"]
GPT2_SMALL = load_model_config("gpt2-small")


def test_tied_embedding_is_complete_last_and_the_head_readies_nothing():
    grads = transformer_gradients(GPT2_SMALL)
    wte = grads[0]
    assert wte.elements == GPT2_SMALL.vocab_size * GPT2_SMALL.d_model and wte.ready_share == pytest.approx(1.0)
    assert ready_order(grads)[-1] is wte  # the embedding's own backward comes last
    assert sum(g.elements for g in grads) == GPT2_SMALL.params()
    # backward opens with the tied head: nothing is complete before it is done (matrices' FLOPs: V d of it
    # against the layers' parameters)
    head = GPT2_SMALL.vocab_size * GPT2_SMALL.d_model
    total = head + GPT2_SMALL.layers * GPT2_SMALL.layer_params()
    assert min(g.ready_share for g in grads) == pytest.approx(head / total, rel=1e-9)


def test_gpt_small_tied_embedding_is_the_last_bucket():
    buckets = DDP.exchange(transformer_gradients(GPT2_SMALL))
    assert buckets[-1].ready_share == pytest.approx(1.0)
    assert buckets[-1].nbytes >= 4 * 50257 * 768  # wte's 154 MB end the step
    assert buckets[0].ready_share > 0.25  # the head's backward (about a quarter) readies nothing
    assert [b.ready_share for b in buckets] == sorted(b.ready_share for b in buckets)


def test_the_readiness_by_layer_agrees_with_the_flops_traced_on_the_built_model():
    """Oracle: the registry's GPT-2 small built on the meta device, each gradient's share of backward's FLOPs
    traced (attention's own FLOPs and the loss are in the trace, not in the model's count by matrices)."""
    pytest.importorskip("torch")
    from meshscale.train.readiness import traced_gradients

    traced = traced_gradients("gpt-small")
    model = transformer_gradients(GPT2_SMALL)
    if [e for e, _ in traced] != [g.elements for g in model]:
        pytest.skip("train builds GPT-2 with another parameter layout")
    assert [s for _, s in traced] == pytest.approx([g.ready_share for g in model], abs=0.06)


def test_ddp_buckets_as_ddp_builds_them():
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch without distributed")
    grads = resnet50_gradients()
    ordered = ready_order(grads)
    limits = [1 << 20, 25 << 20]
    indices, _ = dist._compute_bucket_assignment_by_size([torch.empty(t.elements, device="meta") for t in ordered],
                                                         limits, [False] * len(ordered))
    expected = [4.0 * sum(ordered[i].elements for i in bucket) for bucket in indices]
    buckets = DDP.exchange(grads)
    assert [b.nbytes for b in buckets] == expected
    # a bucket starts once all its gradients are complete: its last tensor's share
    assert [b.ready_share for b in buckets] == [max(ordered[i].ready_share for i in bucket) for bucket in indices]


def test_a_bucket_waits_for_its_slowest_gradient():
    mib = 1 << 20
    grads = [GradientTensor(mib // 4, 0.9), GradientTensor(mib // 8, 0.2), GradientTensor(mib // 8, 0.1),
             GradientTensor(mib, 0.05)]
    buckets = DDP.exchange(grads)  # ready order: 1 MiB (0.05), then the rest in one bucket
    assert [b.nbytes for b in buckets] == [4 * mib, 2 * mib]
    assert [b.ready_share for b in buckets] == [0.05, 0.9]


def test_a_big_first_layer_without_gradients_hides_less():
    sizes = [4_000_000] * 20
    byte_share = [GradientTensor(n, (i + 1) / 20) for i, n in enumerate(reversed(sizes))][::-1]
    head_first = [GradientTensor(n, 0.3 + 0.7 * (i + 1) / 20) for i, n in enumerate(reversed(sizes))][::-1]

    def exposed(grads):
        buckets = DDP.exchange(grads)
        times = [b.nbytes / 3e9 for b in buckets]
        return exposed_exchange_s(times, [b.ready_share for b in buckets], 0.05, 0.075)

    assert exposed(head_first) > exposed(byte_share) + 0.005


def test_unknown_structure_falls_back_to_the_share_of_bytes():
    grads = [GradientTensor(50_000_000)]   # a model timed by its measured step, its layers unknown
    buckets = DDP.exchange(grads)
    total = 4 * 50_000_000
    done = 0.0
    for b in buckets:
        done += b.nbytes
        assert b.ready_share == pytest.approx(done / total)


@pytest.mark.gpu  # torchvision (not a dependency) is installed on the device machine, where the gpu tests run
def test_resnet50_layout_matches_torchvision():
    import torch
    import torchvision
    with torch.device("meta"):
        model = torchvision.models.resnet50()
    assert [p.numel() for p in model.parameters()] == [g.elements for g in resnet50_gradients()]
    from meshscale.train.readiness import traced_gradients
    traced = traced_gradients("resnet50")  # the tracing, on torchvision's ResNet-50
    assert [share for _, share in traced] == pytest.approx([g.ready_share for g in resnet50_gradients()])


def test_readiness_measured_on_one_device_orders_the_gradients_as_backward_completes_them():
    from meshscale.train.config import TrainConfig
    from meshscale.train.readiness import gradient_readiness
    from meshscale.train.readiness import traced_gradients
    measured = gradient_readiness(TrainConfig(model="gpt-tiny"), batch=4, steps=3, warmup=1)
    traced = traced_gradients("gpt-tiny")
    assert [e for e, _ in measured] == [e for e, _ in traced]  # parameter order, every parameter
    shares = [share for _, share in measured]
    assert all(0 <= s <= 1 for s in shares)
    assert shares[0] == max(shares) and shares[0] > 0.9  # the tied embedding: complete at the very end
    first_block, last_block = shares[1:13], shares[-14:-2]  # (block 0's tensors, block n-1's)
    assert max(last_block) < min(first_block)  # backward completes the output side first
    assert min(shares) > 0  # nothing before the tied head's and the loss's backward


def test_a_profile_with_measured_readiness_sets_when_the_buckets_start(tmp_path):
    from dataclasses import replace

    from meshscale.predict.profile import profile_from_result
    from meshscale.predict.request import prepare
    from meshscale.predict.question import PredictRequest
    from meshscale.results import Result
    from meshscale.train.readiness import traced_gradients
    elements = [e for e, _ in traced_gradients("gpt-tiny")]
    late = Result("train", [{"batch_per_rank": 8, "step_time_s": 0.1}], meta={
        "profile": True, "model": "gpt-tiny", "gradients": [[e, 0.9 if i else 1.0] for i, e in enumerate(elements)]})
    profile = profile_from_result(late)
    job = prepare(PredictRequest(model="gpt-tiny", system="dgx1-p100", profile=profile, gpus=(2,))).job
    assert [g.ready_share for g in job.gradients()] == [1.0] + [0.9] * (len(elements) - 1)
    other = replace(job, measured_gradients=(GradientTensor(sum(elements) + 1, 0.5),))  # another model's: not taken
    assert other.gradients() == transformer_gradients(job.model)
    bad = Result("train", late.rows, meta={**late.meta, "gradients": [["x", 1]]})
    with pytest.raises(MeshscaleError, match="meta.gradients"):
        profile_from_result(bad)


# ---- the exposed exchange: buckets one at a time, each from the moment its gradients are complete --------------
def _random_exchange(rng: random.Random, buckets: int) -> tuple[list[float], list[float], float, float]:
    times = [rng.uniform(0, 0.02) for _ in range(buckets)]
    shares = sorted(rng.uniform(0, 1) for _ in range(buckets))  # issued in the order backward completes them
    compute = rng.uniform(0.01, 0.1)
    return times, shares, rng.uniform(0, 1) * compute, compute


def _critical_path_s(times, shares, backward_s, compute_s) -> float:
    """An independent statement of the same queue: the exchange ends at the latest, over every bucket k, of
    k's start (its release, or the start of compute) plus all the work from k on; exposed is what passes compute."""
    ends = [max(-compute_s, -backward_s * (1 - shares[k])) + sum(times[k:]) for k in range(len(times))]
    return max([0.0] + ends)


def test_exposed_exchange_is_the_queue_critical_path():
    rng = random.Random(7)
    for _ in range(200):
        args = _random_exchange(rng, rng.randint(1, 12))
        assert exposed_exchange_s(*args) == pytest.approx(_critical_path_s(*args), abs=1e-15)


def test_exposed_exchange_is_bounded_by_the_whole_exchange_and_never_negative():
    rng = random.Random(11)
    for _ in range(200):
        times, shares, backward, compute = _random_exchange(rng, rng.randint(1, 12))
        exposed = exposed_exchange_s(times, shares, backward, compute)
        assert 0.0 <= exposed <= sum(times) + 1e-15
        # a framework that starts every bucket after backward (shares 1.0) hides nothing
        assert exposed_exchange_s(times, [1.0] * len(times), backward, compute) == pytest.approx(sum(times))


def test_exposed_exchange_grows_with_the_bytes_and_vanishes_when_backward_covers_them():
    rng = random.Random(3)
    times, shares, backward, compute = _random_exchange(rng, 8)
    exposed = [exposed_exchange_s([t * k for t in times], shares, backward, compute) for k in (0.5, 1, 2, 4, 8, 16)]
    assert exposed == sorted(exposed)
    assert exposed_exchange_s(times, [0.0] * len(times), sum(times), sum(times)) == 0.0  # all ready at once, covered
    # gradients completing later (higher shares) leave more exposed, never less
    later = [min(1.0, s + 0.2) for s in shares]
    assert exposed_exchange_s(times, later, backward, compute) >= exposed_exchange_s(times, shares, backward, compute)
