"""A Nomad HTTP API simulator: see docs/simulator.md."""

from controller.lab.simulator.server import SimServer, start_sim
from controller.lab.simulator.state import Simulator

__all__ = ["SimServer", "Simulator", "start_sim"]
