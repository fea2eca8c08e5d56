"""Tests against a real etcd and kube-apiserver (controller/lab/kube.py)."""
