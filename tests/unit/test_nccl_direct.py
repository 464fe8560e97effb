"""--impl nccl without a GPU: the send/recv groups move every chunk where `meshscale.bench.cases` expects it,
the library lookup fails with a clear error where there is no NCCL, and CPU workers are refused."""
import pytest

from meshscale.bench.nccl_direct import NCCL_DTYPES, NCCL_OPS, load_nccl
from meshscale.collectives.kinds import direct_peers, kind
from meshscale.bench.cases import DTYPES, OPS
from meshscale.errors import MeshscaleError


def _move(collective, world, root):
    """Run every rank's group on symbolic buffers: inp chunk k of rank r is (r, k); returns each rank's out."""
    inp = {r: [(r, k) for k in range(world)] for r in range(world)}
    sent = {}  # (src, dst) -> chunk
    for r in range(world):
        for peer, send_at, _ in direct_peers(kind(collective), r, world, root):
            if send_at is not None:
                assert (r, peer) not in sent
                sent[(r, peer)] = inp[r][send_at]
    out = {r: {} for r in range(world)}
    for r in range(world):
        for peer, _, recv_at in direct_peers(kind(collective), r, world, root):
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
    monkeypatch.setattr(nccl_direct, "launch_handle", lambda lib: lib)
    monkeypatch.setattr(nccl_direct.torch.cuda, "device", lambda d: __import__("contextlib").nullcontext())
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=5))
    for _ in range(2):
        nccl_direct.NcclComm(0, 2, None, store)
    assert store.check(["meshscale/nccl-uid/1"]) and store.check(["meshscale/nccl-uid/2"])


class _RecordingLib:
    """Stands in for the launch handle: records each call with its arguments; returns ``code``."""

    def __init__(self, code: int = 0, missing: tuple[str, ...] = ()):
        self.calls, self.code, self.missing = [], code, missing

    def __getattr__(self, name):
        if name in self.missing:  # as ctypes does for a symbol the library does not export
            raise AttributeError(name)
        def call(*args):
            self.calls.append((name, args))
            return self.code if name not in ("ncclGroupStart", "ncclGroupEnd") else 0
        return call

    def ncclGetErrorString(self, code):
        return b"unhandled cuda error"


def _comm_with(fast, rank=0, world=2):
    import ctypes
    import torch
    from meshscale.bench import nccl_direct
    comm = nccl_direct.NcclComm.__new__(nccl_direct.NcclComm)
    comm.lib, comm.fast, comm.comm = fast, fast, ctypes.c_void_p(0xC0FFEE)
    comm.rank, comm.world, comm.device = rank, world, torch.device("cuda", 0)
    return comm


def test_launch_path_passes_ctypes_objects_with_nccl_tests_counts(monkeypatch):
    """Every argument is a ctypes object (a function without argtypes would truncate a bare int pointer),
    counts are nccl-tests' (reduce_scatter: per-rank output; all_gather: per-rank input), the stream is last."""
    import ctypes
    import torch
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 0x5EED, raising=False)
    inp, out = torch.zeros(8), torch.zeros(16)
    expect = {"all_reduce": ("ncclAllReduce", 8), "all_gather": ("ncclAllGather", 8),
              "broadcast": ("ncclBroadcast", 8), "reduce": ("ncclReduce", 8)}
    for collective, (fn, count) in expect.items():
        fast = _RecordingLib()
        _comm_with(fast).op(collective, "max", 1)(inp, out)
        (name, args), = fast.calls
        assert name == fn and all(isinstance(a, ctypes._SimpleCData) for a in args)
        assert args[0].value == inp.data_ptr() and args[1].value == out.data_ptr() and args[2].value == count
        assert args[3].value == 7 and args[-2].value == 0xC0FFEE and args[-1].value == 0x5EED
    fast = _RecordingLib()
    _comm_with(fast).op("reduce_scatter", "max", 0)(out, inp)
    assert fast.calls[0][1][2].value == 8 and fast.calls[0][1][4].value == 2  # recvcount, ncclMax


def test_launch_path_groups_all_to_all_and_reports_failures(monkeypatch):
    """Before NCCL 2.28 all_to_all is nccl-tests' group of send/recv per peer; from 2.28 one ncclAlltoAll call
    with the per-peer count; send_recv is always a group; a failing code raises with the collective's name."""
    import pytest
    import torch
    from meshscale.errors import MeshscaleError
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 0, raising=False)
    inp, out = torch.zeros(8), torch.zeros(8)
    fast = _RecordingLib(missing=("ncclAlltoAll",))
    run = _comm_with(fast, rank=1, world=2).op("all_to_all", "sum", 0)
    run(inp, out)
    run(inp, out)  # the second call reuses the plan: same calls again
    names = [n for n, _ in fast.calls]
    assert names == ["ncclGroupStart", "ncclSend", "ncclRecv", "ncclSend", "ncclRecv", "ncclGroupEnd"] * 2
    sends = [a for n, a in fast.calls[:6] if n == "ncclSend"]
    assert [a[0].value - inp.data_ptr() for a in sends] == [0, 16] and all(a[1].value == 4 for a in sends)

    fast = _RecordingLib()
    _comm_with(fast, rank=1, world=2).op("all_to_all", "sum", 0)(inp, out)
    (name, args), = fast.calls
    assert name == "ncclAlltoAll" and args[2].value == 4 and len(args) == 6
    fast = _RecordingLib()
    _comm_with(fast, rank=0, world=2).op("scatter", "sum", 1)(inp, out[:4])
    (name, args), = fast.calls
    assert name == "ncclScatter" and args[2].value == 4 and args[4].value == 1
    fast = _RecordingLib()
    _comm_with(fast, rank=0, world=2).op("send_recv", "sum", 0)(inp, out)
    assert [n for n, _ in fast.calls] == ["ncclGroupStart", "ncclSend", "ncclRecv", "ncclGroupEnd"]

    with pytest.raises(MeshscaleError, match="all_reduce failed on rank 0: unhandled cuda error"):
        _comm_with(_RecordingLib(code=1)).op("all_reduce", "sum", 0)(inp, out)
