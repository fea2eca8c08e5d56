"""A Nomad HTTP API simulator: see docs/simulator.md."""

from controller.simulator.server import SimServer, start_sim
from controller.simulator.state import Simulator

__all__ = ["SimServer", "Simulator", "start_sim"]
