"""The DeviceMesh of a layout: dimensions named as `ParallelLayout.DIMENSIONS`, outermost (pp) first, so the
mesh's row-major rank order is the layout's (tp consecutive ranks)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshscale.models.layout import DIMENSIONS, ParallelLayout

OUTER_FIRST = tuple(reversed(DIMENSIONS))   # ("pp", "dp", "fsdp", "cp", "tp")


@dataclass
class LayoutMesh:
    """The world mesh and the sub-meshes the engines take."""

    layout: ParallelLayout
    world: DeviceMesh

    def __getitem__(self, dim: str) -> DeviceMesh:
        return self.world[dim]

    def coordinate(self, dim: str) -> int:
        return self.world[dim].get_local_rank()

    @property
    def data_rank(self) -> int:
        """This rank's index among the ranks that see different samples (dp x fsdp)."""
        return self.coordinate("dp") * self.layout.fsdp + self.coordinate("fsdp")

    def sharding_mesh(self) -> DeviceMesh:
        """FSDP2's mesh: the ranks that hold the same parameters and average their gradients: fsdp and cp
        (context-parallel ranks see other tokens of the same samples), as one shard dimension; with --dp
        replicas, a 2-D (replicate, shard) mesh: FSDP2's hybrid mode."""
        shard = self.world["fsdp", "cp"]._flatten("fsdp_cp")
        if self.layout.dp == 1:
            return shard
        return self.world["dp", "fsdp_cp"]


def layout_mesh(layout: ParallelLayout, device: torch.device) -> LayoutMesh:
    shape = tuple(getattr(layout, d) for d in OUTER_FIRST)
    return LayoutMesh(layout, init_device_mesh(device.type, shape, mesh_dim_names=OUTER_FIRST))
