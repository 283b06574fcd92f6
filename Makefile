# fracspawner developer commands. Each target does its own set-up and is quick when already set up.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMPS := .stamps
export PATH := $(CURDIR)/node_modules/.bin:$(CURDIR)/$(BIN):$(PATH)

.PHONY: help setup test lint demo bench docs clean system-deps labextension test-gpu images controlplane

help:
	@echo "make demo   - real Kubernetes control plane + node agent + JupyterHub with FracSpawner on http://127.0.0.1:8000 (PORT=8080 for another)"
	@echo "make test   - ruff + the whole test suite (installs what it needs; Go 1.26+ must be there)"
	@echo "make bench  - benchmarks, results in benchmarks/results/ (builds the control plane first)"
	@echo "make images - build images/*/Dockerfile with a real dockerd (make test does it too)"
	@echo "make test-gpu - the real-GPU suite (tests/gpu; skips with the reason without an NVIDIA GPU)"
	@echo "make docs   - Sphinx docs (warnings are errors) in docs/_build/html"
	@echo "make controlplane - build the real Kubernetes control plane (once per pin; docs/controlplane.md)"

# --- set-up -------------------------------------------------------------------------------
$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMPS)/venv: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,docs]'
	@# rfc3987-syntax compiles ~35 Earley parsers when jsonschema imports it: 1.7 s of CPU in
	@# every hub, single-user server and culler the tests start (jupyter-server#1559,
	@# jsonschema#1428). It is only jsonschema's optional IRI format checker, pulled in by
	@# jupyter-events' jsonschema[format-nongpl]; no schema here or in Jupyter uses that format.
	$(BIN)/pip uninstall -y -q rfc3987-syntax
	@mkdir -p $(STAMPS) && touch $@

node_modules/.bin/configurable-http-proxy: package.json
	npm install --no-audit --no-fund --loglevel=error
	@touch $@

# Debian packages the tests use: chromium (picker browser tests), prometheus (culler tests),
# kubectl (the tests drive the real control plane and the node agent's kubelet API with it;
# Debian's package is kubernetes-client), docker.io (dockerd,
# containerd, runc: tests/test_images.py builds images/*/Dockerfile for real) and mmdebstrap
# (the Debian root file system of its stand-in base images, docs/images.md).
# (re-checked when this Makefile changes: a new package here reaches machines already set up)
$(STAMPS)/system-deps: Makefile
	@missing=""; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v kubectl >/dev/null || missing="$$missing kubernetes-client"; \
	[ -x /usr/sbin/dockerd ] && [ -x /usr/bin/docker ] || missing="$$missing docker.io"; \
	command -v mmdebstrap >/dev/null || missing="$$missing mmdebstrap"; \
	if [ -n "$$missing" ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@mkdir -p $(STAMPS) && touch $@

# The JupyterLab GPU meter (labextension/): `npm run build` (tsc + jupyter-builder), output in
# labextension/prebuilt (never committed; the wheel ships it as share/jupyter/labextensions/...),
# copied into the venv so the JupyterLab the tests start loads it. Rebuilt when a source changes.
# Wheels build it themselves when it is missing (pyproject.toml's jupyter-builder hook, which also
# runs in the editable install above on a fresh clone); here it is kept current for the tests.
LABEXT := labextension
LABEXT_DEST := $(VENV)/share/jupyter/labextensions/fracspawner-gpu-meter
LABEXT_SOURCES := $(wildcard $(LABEXT)/src/*.ts $(LABEXT)/style/*) $(LABEXT)/package.json \
	$(LABEXT)/tsconfig.json $(LABEXT)/install.json

$(LABEXT)/node_modules/.package-lock.json: $(LABEXT)/package.json $(LABEXT)/package-lock.json
	cd $(LABEXT) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

$(STAMPS)/labextension: $(LABEXT_SOURCES) $(LABEXT)/node_modules/.package-lock.json $(STAMPS)/venv
	cd $(LABEXT) && npm run build
	rm -rf $(LABEXT_DEST) && mkdir -p $(LABEXT_DEST)
	cp -R $(LABEXT)/prebuilt/. $(LABEXT)/install.json $(LABEXT_DEST)/
	@mkdir -p $(STAMPS) && touch $@

labextension: $(STAMPS)/labextension

# checkov (tests/test_chart.py scans the rendered Helm chart with it) pins packaging<24, which
# the test environment cannot have (pytest needs packaging>=24): it gets a venv of its own.
CHECKOV_VENV := .venv-checkov
$(CHECKOV_VENV)/bin/checkov:
	$(PY) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q --upgrade pip
	$(CHECKOV_VENV)/bin/pip install -q 'checkov==3.3.30'

setup: $(STAMPS)/venv node_modules/.bin/configurable-http-proxy $(STAMPS)/system-deps \
	$(STAMPS)/labextension $(CHECKOV_VENV)/bin/checkov

system-deps: $(STAMPS)/system-deps

# The real Kubernetes control plane (controlplane/: etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager from k8s.io/kubernetes at the pin in controlplane/go.mod) in one binary,
# .cache/controlplane/<pin>/kube-controlplane. The script rebuilds only when go.mod, go.sum or a
# .go file changes, checks Go, the module proxy and disk space first, and prints its progress.
controlplane:
	@hack/build-controlplane.sh

# --- commands -----------------------------------------------------------------------------
lint: $(STAMPS)/venv
	$(BIN)/ruff check fracspawner devcluster tests benchmarks docs
	$(BIN)/ruff format --check fracspawner devcluster tests benchmarks

# Test files run in parallel (pytest-xdist, whole files per worker: a module's hub and
# devcluster start once), the slowest files first (tests/xdist_order.py); PYTEST_WORKERS=0 runs
# them in this process, one after another.
PYTEST_WORKERS ?= 3
test: setup lint controlplane
	$(BIN)/python -m pytest $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

# The real-GPU suite (tests/gpu; docs/serverext.md "The real-GPU suite"): not part of `make test`.
# On a machine with an NVIDIA GPU and driver it installs cupy-cuda12x and cuda-python into the
# venv and runs; elsewhere every test skips with the reason. It prints a table of what it measured.
# GPU_PYTHON=python3: run with an interpreter that already holds CuPy, cuda-python, nvidia-ml-py,
# jupyter-server, ipykernel, pytest-asyncio and dnspython (a GPU machine with no package index:
# docs/serverext.md); no venv is made then
test-gpu: $(if $(GPU_PYTHON),,$(STAMPS)/venv)
	@if [ -z "$(GPU_PYTHON)" ] && command -v nvidia-smi >/dev/null 2>&1; then \
	  $(BIN)/pip install -q 'cupy-cuda12x' 'cuda-python>=12.8,<13' || echo "test-gpu: could not install cupy-cuda12x/cuda-python"; \
	fi
	FRACSPAWNER_GPU_TESTS=1 $(or $(GPU_PYTHON),$(BIN)/python) -m pytest tests/gpu -rs -p no:cacheprovider $(PYTEST_ARGS)

# images/*/Dockerfile built by a real Docker daemon of its own on stand-in base images, with
# progress (tests/image_builds.py, docs/images.md); tests/test_images.py, part of `make test`,
# does the same and runs each image. Cached in /var/cache/fracspawner-images.
images: $(STAMPS)/venv $(STAMPS)/system-deps
	$(BIN)/python -m tests.image_builds

# The demo runs on the real control plane (docs/quickstart.md): built first, once per pin, with progress.
demo: $(STAMPS)/venv node_modules/.bin/configurable-http-proxy controlplane
	$(BIN)/fracspawner demo $(if $(PORT),--port $(PORT))

bench: setup controlplane
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

docs: $(STAMPS)/venv
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) node_modules $(STAMPS) docs/_build .devcluster .demo \
		$(LABEXT)/node_modules $(LABEXT)/lib $(LABEXT)/prebuilt $(LABEXT)/tsconfig.tsbuildinfo
