"""poolkeeper: keeps pools of warm code-execution runners on HashiCorp Nomad."""

__version__ = "0.1.0"
