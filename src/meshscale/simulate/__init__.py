"""Layer 3a: predict how long collectives take on a topology (flow-level simulation of schedules, NCCL's model),
priced through one `Fabric` (`simulate.fabric`)."""
from meshscale.simulate.auto import Choice, choose, choose_and_simulate
from meshscale.simulate.fabric import Fabric, resolve_fabric
from meshscale.simulate.link_fit import calibrate, calibrate_collective
from meshscale.simulate.params import SimParams
from meshscale.simulate.sim import LinkUse, SimResult, simulate

__all__ = ["SimParams", "SimResult", "LinkUse", "simulate", "choose", "choose_and_simulate", "Choice", "Fabric",
           "resolve_fabric", "calibrate", "calibrate_collective"]
