"""Connection settings shared by python-nomad's integration tests (written for the simulator).

test_acl.py stores the bootstrap token in NOMAD_TOKEN; later modules read it from here.
"""

import os

IP = os.environ.get("NOMAD_IP", "127.0.0.1")
NOMAD_PORT = os.environ.get("NOMAD_PORT", "4646")
NOMAD_TOKEN = os.environ.get("NOMAD_TOKEN")
NOMAD_NAMESPACE = "admin"
