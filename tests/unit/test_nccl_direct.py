"""--impl nccl without a GPU: the send/recv groups move every chunk where `meshscale.bench.cases` expects it,
the library lookup fails with a clear error where there is no NCCL, and CPU workers are refused."""
import pytest

from meshscale.bench.nccl_direct import NCCL_DTYPES, NCCL_OPS, _peer_pattern, load_nccl
from meshscale.bench.cases import DTYPES, OPS
from meshscale.errors import MeshscaleError


def _move(collective, world, root):
    """Run every rank's group on symbolic buffers: inp chunk k of rank r is (r, k); returns each rank's out."""
    inp = {r: [(r, k) for k in range(world)] for r in range(world)}
    sent = {}  # (src, dst) -> chunk
    for r in range(world):
        for peer, send_at, _ in _peer_pattern(collective, r, world, root):
            if send_at is not None:
                assert (r, peer) not in sent
                sent[(r, peer)] = inp[r][send_at]
    out = {r: {} for r in range(world)}
    for r in range(world):
        for peer, _, recv_at in _peer_pattern(collective, r, world, root):
            if recv_at is not None:
                out[r][recv_at] = sent.pop((peer, r))  # a receive with no matching send raises KeyError
    assert not sent, f"sends nobody receives: {sent}"
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_groups_deliver_every_chunk(world):
    for r, got in _move("all_to_all", world, 0).items():
        assert got == {s: (s, r) for s in range(world)}  # chunk s of out = what rank s sent to r
    for root in range(world):
        gathered = _move("gather", world, root)
        assert gathered[root] == {s: (s, 0) for s in range(world)}
        assert all(gathered[r] == {} for r in range(world) if r != root)
        scattered = _move("scatter", world, root)
        assert all(scattered[r] == {0: (root, r)} for r in range(world))
    ring = _move("send_recv", world, 0)
    assert all(ring[r] == {0: ((r - 1) % world, 0)} for r in range(world))


def test_every_dtype_and_op_has_an_nccl_code():
    import torch
    assert set(NCCL_DTYPES) == set(DTYPES.values()) and set(NCCL_OPS) == set(OPS)
    assert NCCL_DTYPES[torch.float32] == 7 and NCCL_DTYPES[torch.bfloat16] == 9 and NCCL_OPS["avg"] == 4


def test_library_lookup_either_binds_or_says_why():
    try:
        lib = load_nccl()
    except MeshscaleError as err:
        assert "libnccl.so.2" in str(err) and "--impl native" in str(err)
    else:
        assert lib.ncclAllReduce.argtypes and lib.ncclSend.restype is not None


def test_each_communicator_gets_its_own_unique_id_key(monkeypatch):
    """Two communicators made in one launch must not share the store key of their NCCL id."""
    import torch.distributed as dist
    from datetime import timedelta
    from meshscale.bench import nccl_direct

    class FakeLib:
        def ncclGetUniqueId(self, uid_ref):
            return 0

        def ncclCommInitRank(self, *args):
            return 0

    monkeypatch.setattr(nccl_direct, "load_nccl", lambda: FakeLib())
    monkeypatch.setattr(nccl_direct.torch.cuda, "device", lambda d: __import__("contextlib").nullcontext())
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=5))
    for _ in range(2):
        nccl_direct.NcclComm(0, 2, None, store)
    assert store.check(["meshscale/nccl-uid/1"]) and store.check(["meshscale/nccl-uid/2"])
