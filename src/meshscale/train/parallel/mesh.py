"""The DeviceMesh of a layout: dimensions named as `ParallelLayout.DIMENSIONS`, outermost (pp) first, so the
mesh's row-major rank order is the layout's (tp consecutive ranks)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshscale.models.layout import DIMENSIONS, ParallelLayout

OUTER_FIRST = tuple(reversed(DIMENSIONS))   # ("pp", "dp", "fsdp", "ep", "cp", "tp")


@dataclass
class LayoutMesh:
    """The world mesh and the sub-meshes the engines take."""

    layout: ParallelLayout
    world: DeviceMesh
    _flattened: set[str] = field(default_factory=set)

    def __getitem__(self, dim: str) -> DeviceMesh:
        return self.world[dim]

    def coordinate(self, dim: str) -> int:
        return self.world[dim].get_local_rank()

    @property
    def data_rank(self) -> int:
        """This rank's index among the ranks that see different samples (dp x fsdp x ep)."""
        return (self.coordinate("dp") * self.layout.fsdp + self.coordinate("fsdp")) * self.layout.ep \
            + self.coordinate("ep")

    def flat(self, dims: tuple[str, ...]) -> DeviceMesh:
        """The ranks along ``dims`` as one mesh dimension named by them joined ("fsdp_cp": its process group is
        "mesh_fsdp_cp", which the flight recorder names), made once."""
        name = "_".join(dims)
        if name not in self._flattened:
            self.world[dims]._flatten(name)
            self._flattened.add(name)
        return self.world[name]

    def fsdp_mesh(self, dims: tuple[str, ...]) -> DeviceMesh:
        """FSDP2's mesh over ``dims`` (one shard dimension); with --dp replicas, a 2-D (replicate, shard) mesh:
        FSDP2's hybrid mode."""
        shard = self.flat(dims)
        return shard if self.layout.dp == 1 else self.world["dp", "_".join(dims)]

    def sharding_mesh(self) -> DeviceMesh:
        """FSDP2's mesh for all but the routed experts: the ranks that hold the same parameters and average their
        gradients: fsdp, ep (other samples) and cp (context-parallel ranks see other tokens of the same samples)."""
        return self.fsdp_mesh(SHARD_DIMS if self.layout.ep == 1 else SHARD_DIMS_EP)


SHARD_DIMS, SHARD_DIMS_EP = ("fsdp", "cp"), ("fsdp", "ep", "cp")
# a mixture of experts' parts: the routed experts (an ep rank holds its own, the tp ranks hold other tokens), the
# router and shared experts (every data rank's, and under tp of its tokens)
EXPERT_DIMS, MOE_DIMS = ("fsdp", "cp", "tp"), ("fsdp", "ep", "cp", "tp")


def layout_mesh(layout: ParallelLayout, device: torch.device) -> LayoutMesh:
    shape = tuple(getattr(layout, d) for d in OUTER_FIRST)
    return LayoutMesh(layout, init_device_mesh(device.type, shape, mesh_dim_names=OUTER_FIRST))
