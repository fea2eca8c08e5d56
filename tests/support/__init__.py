"""Helpers shared by the test packages, each defined once."""
