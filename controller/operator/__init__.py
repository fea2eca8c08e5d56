"""`poolkeeper operator`: the controller driven by RunnerPool custom resources (kopf)."""
