"""Tests against a real etcd and kube-apiserver (tests/support/kube_cluster.py)."""
