"""Layer 3a: predict how long collectives take on a topology (flow-level simulation of schedules)."""
from meshscale.simulate.auto import Choice, choose, choose_and_simulate, predict_collective
from meshscale.simulate.link_fit import calibrate, calibrate_collective
from meshscale.simulate.params import SimParams
from meshscale.simulate.sim import LinkUse, SimResult, simulate

__all__ = ["SimParams", "SimResult", "LinkUse", "simulate", "choose", "choose_and_simulate", "Choice", "predict_collective",
           "calibrate", "calibrate_collective"]
