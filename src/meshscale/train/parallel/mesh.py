"""The DeviceMesh of a layout: dimensions named as `ParallelLayout.DIMENSIONS`, outermost (pp) first, so the
mesh's row-major rank order is the layout's (tp consecutive ranks). Expert parallelism borrows data-parallel
ranks (models/layout.py: `ParallelLayout.expert_groups`): the routed experts get a mesh of their own over the same
ranks, (pp, expert replicas, expert shards, ep, tp), as torchtitan's dp_shard_in_ep / dp_shard_mod_ep split."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshscale.models.layout import DIMENSIONS, ParallelLayout

OUTER_FIRST = tuple(reversed(DIMENSIONS))   # ("pp", "dp", "fsdp", "cp", "tp")
EXPERT_OUTER_FIRST = ("pp", "edp", "efsdp", "ep", "tp")   # the experts' mesh: edp/efsdp = expert_dp/expert_fsdp
SHARD_DIMS = ("fsdp", "cp")
# a mixture of experts' router and shared experts (and without ep its routed experts) under tp: every data rank's,
# and the tp ranks hold other tokens of the sequence
MOE_DIMS = ("fsdp", "cp", "tp")


@dataclass
class LayoutMesh:
    """The world mesh and the sub-meshes the engines take; ``experts``: the routed experts' mesh (ep > 1)."""

    layout: ParallelLayout
    world: DeviceMesh
    experts: Optional[DeviceMesh] = None
    _flattened: set[str] = field(default_factory=set)

    def __getitem__(self, dim: str) -> DeviceMesh:
        return self.world[dim]

    def coordinate(self, dim: str) -> int:
        return self.world[dim].get_local_rank()

    @property
    def data_rank(self) -> int:
        """This rank's index among the ranks that see different samples (dp x fsdp)."""
        return self.coordinate("dp") * self.layout.fsdp + self.coordinate("fsdp")

    def _flat(self, mesh: DeviceMesh, dims: tuple[str, ...]) -> DeviceMesh:
        """The ranks along ``dims`` as one mesh dimension named by them joined ("fsdp_cp": its process group is
        "mesh_fsdp_cp", which the flight recorder names), made once."""
        name = "_".join(dims)
        if name not in self._flattened:
            mesh[dims]._flatten(name)
            self._flattened.add(name)
        return mesh[name]

    def fsdp_mesh(self, dims: tuple[str, ...]) -> DeviceMesh:
        """FSDP2's mesh over the world's ``dims`` (one shard dimension); with --dp replicas, a 2-D (replicate,
        shard) mesh: FSDP2's hybrid mode."""
        shard = self._flat(self.world, dims)
        return shard if self.layout.dp == 1 else self.world["dp", "_".join(dims)]

    def sequence_group(self):
        """The ranks that hold parts of the same sequences (cp x tp)."""
        return self._flat(self.world, ("cp", "tp")).get_group()

    def sharding_mesh(self) -> DeviceMesh:
        """FSDP2's mesh for all but the routed experts: the ranks that hold the same parameters and average their
        gradients: fsdp and cp (context-parallel ranks see other tokens of the same samples), as one shard
        dimension."""
        return self.fsdp_mesh(SHARD_DIMS)

    def expert_sharding_mesh(self) -> DeviceMesh:
        """FSDP2's mesh for the routed experts: what ep leaves of the data-parallel ranks and the tp ranks (other
        tokens) as the shard dimension, the expert replicas as FSDP2's replicate dimension; without ep, the
        world's fsdp x cp x tp."""
        if self.experts is None:
            return self.fsdp_mesh(MOE_DIMS)
        shard = self._flat(self.experts, ("efsdp", "tp"))
        return shard if self.layout.expert_dp == 1 else self.experts["edp", "efsdp_tp"]


def expert_mesh(layout: ParallelLayout, device_type: str) -> DeviceMesh:
    """The world's ranks arranged by `ParallelLayout.expert_groups`: ep consecutive positions of the combined
    cp x fsdp x dp index form an ep group; its experts are sharded over the ranks at the same position of the next
    ``expert_fsdp`` groups and replicated over the rest."""
    shape = (layout.pp, layout.expert_dp, layout.expert_fsdp, layout.ep, layout.tp)
    ranks = torch.full(shape, -1, dtype=torch.int)
    for rank in range(layout.world_size):
        groups, c = layout.expert_groups(rank), layout.coordinates(rank)
        ranks[c["pp"], groups["expert_dp"].index(rank), groups["expert_fsdp"].index(rank), groups["ep"].index(rank),
              c["tp"]] = rank
    assert sorted(ranks.flatten().tolist()) == list(range(layout.world_size)), "expert groups do not tile the world"
    return DeviceMesh(device_type, ranks, mesh_dim_names=EXPERT_OUTER_FIRST)


def layout_mesh(layout: ParallelLayout, device: torch.device) -> LayoutMesh:
    shape = tuple(getattr(layout, d) for d in OUTER_FIRST)
    world = init_device_mesh(device.type, shape, mesh_dim_names=OUTER_FIRST)
    return LayoutMesh(layout, world, expert_mesh(layout, device.type) if layout.ep > 1 else None)
