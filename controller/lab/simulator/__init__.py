"""A Nomad HTTP API simulator: see docs/simulator.md."""

from controller.lab.simulator.cluster import Simulator
from controller.lab.simulator.server import SimServer, start_sim

__all__ = ["SimServer", "Simulator", "start_sim"]
