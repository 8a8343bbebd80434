# torchfleet: every target does its own set-up, so a fresh clone needs only
# `make test` (the tests) or `make demo` (a TrainingJob trained end to end).
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CLUSTER := $(PY) dev/cluster/localcluster.py
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

# ---- set-up -----------------------------------------------------------------

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (3.11+)"; exit 1; }
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## Python environment in .venv (all extras)

# checkov pins many packages of its own: a virtual environment apart from .venv.
CHECKOV_VENV := .venv-checkov
$(CHECKOV_VENV)/.installed: requirements/checkov.txt
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (3.11+)"; exit 1; }
	[ -x $(CHECKOV_VENV)/bin/python ] || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install -q -r requirements/checkov.txt
	touch $@

.PHONY: checkov
checkov: $(CHECKOV_VENV)/.installed ## checkov, the security scanner the tests run, in .venv-checkov (cached)

# After deps: the build needs the C++ compiler that deps installs.
$(VENV)/.deepspeed-ops: $(VENV)/.installed dev/deepspeed-ops.sh
	dev/deepspeed-ops.sh $(PY) $@

.PHONY: deepspeed-ops
deepspeed-ops: venv deps $(VENV)/.deepspeed-ops ## DeepSpeed's CPU op compiled in, as in its image (cached)

.PHONY: deps
deps: ## Debian packages the tests and demo use (installed only when missing)
	dev/ensure-debian-packages.sh

.PHONY: prometheus-build
prometheus-build: ## Prometheus with Kubernetes SD from Go modules (Debian's 2.42 lacks it), cached
	dev/prometheus/ensure.sh

.PHONY: cluster-build
cluster-build: ## build the control plane from Go modules (cached in ~/.cache/torchfleet)
	dev/cluster/build.sh

.PHONY: realnode-build
realnode-build: ## build the real node (kubelet, containerd, CNI plugins, pause and busybox images, its CoreDNS, a fake-GPU device plugin), cached
	dev/realnode/build.sh
	dev/realnode/gotool.sh coredns
	dev/realnode/gotool.sh deviceplugin

.PHONY: operator-image
operator-image: deps ## build the operator image from its Dockerfile (buildah on a Debian-made Python base), cached
	dev/realnode/operator-image.sh

.PHONY: test-realnode
test-realnode: venv cluster-build realnode-build operator-image ## the real node's tests alone (a kubelet and containerd on the local cluster, the chart installed there)
	$(PY) -m pytest tests/e2e/test_real_node.py tests/e2e/test_real_node_devices.py tests/e2e/test_real_node_training.py tests/e2e/test_helm_real_node.py

KUBERNETES_OLDEST := v1.36.3
.PHONY: test-kubernetes-oldest
test-kubernetes-oldest: venv deps ## the native gang's tests against the oldest supported Kubernetes ($(KUBERNETES_OLDEST), Workload API v1alpha2)
	KUBERNETES_VERSION=$(KUBERNETES_OLDEST) dev/cluster/build.sh >/dev/null
	TORCHFLEET_KUBERNETES_VERSION=$(KUBERNETES_OLDEST) $(PY) -m pytest tests/cluster/test_native_gang_api.py tests/cluster/test_gang_scheduling.py -k 'Kubernetes or native'

.PHONY: kueue-build
kueue-build: ## build Kueue (default pinned in dev/cluster/kueue/versions.env) from its Go module, cached
	dev/cluster/kueue/build.sh

KUEUE_OLDEST := v0.10.6
.PHONY: test-kueue-oldest
test-kueue-oldest: venv deps cluster-build prometheus-build ## the Kueue tests against the oldest supported Kueue ($(KUEUE_OLDEST))
	KUEUE_VERSION=$(KUEUE_OLDEST) dev/cluster/kueue/build.sh
	TORCHFLEET_KUEUE_VERSION=$(KUEUE_OLDEST) $(PY) -m pytest tests/cluster/test_kueue.py tests/cluster/test_kueue_topology.py tests/e2e/test_kueue_preemption.py

.PHONY: schedulers-build
schedulers-build: ## gang schedulers (scheduler-plugins, Volcano) from Go modules, cached
	dev/cluster/schedulers/build.sh >/dev/null

.PHONY: cluster-up
cluster-up: venv cluster-build ## start (or reuse) the local cluster; WITH=kueue,coscheduling,volcano adds those
	$(CLUSTER) up $(if $(WITH),--with $(WITH))

.PHONY: cluster-down
cluster-down: ## stop the local cluster (and the e2e tier's second one, .cluster-e2e/)
	@[ -x $(PY) ] && $(CLUSTER) down || true
	@[ -x $(PY) ] && PY=$(PY) dev/test-tiers.sh down || true

# ---- generated files ------------------------------------------------------------

.PHONY: crds
crds: venv ## regenerate the CRD YAML (crds/ and the chart's copy) from the API models
	$(PY) -m torchfleet_operator.api.crdgen

.PHONY: pod-schema
pod-schema: venv ## refresh the CRD's embedded PodSpec from the oldest supported Kubernetes' OpenAPI (Go module cache), then make crds
	@# The oldest release's schema: a template it would refuse is refused on every release.
	dir=$$( (cd dev/cluster/gomod/$(KUBERNETES_OLDEST) && go mod download -json k8s.io/kubernetes@$(KUBERNETES_OLDEST)) \
	       | $(PY) -c 'import json, sys; print(json.load(sys.stdin)["Dir"])'); \
	$(PY) -m torchfleet_operator.api.crdgen --kubernetes-version $(KUBERNETES_OLDEST) \
	    --pod-schema-source $$dir/api/openapi-spec/v3/api__v1_openapi.json
	$(MAKE) crds

.PHONY: verify
verify: venv ## fail when generated files drift from their sources
	$(PY) -m torchfleet_operator.api.crdgen --check

# ---- checks -----------------------------------------------------------------

.PHONY: lint
lint: venv ## ruff lint + format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

.PHONY: typecheck
typecheck: venv ## mypy over both packages and the e2e harness
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy dev/nodeagent dev/demo.py dev/docs
	$(VENV)/bin/mypy dev/prometheus/prom.py
	$(VENV)/bin/mypy dev/realnode/realnode.py

.PHONY: docs
docs: venv ## the docs site, built strictly (a warning fails it) into .site/; the API reference generated from the models
	DISABLE_MKDOCS_2_WARNING=true NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

.PHONY: test
test: venv checkov deps deepspeed-ops cluster-build realnode-build operator-image kueue-build schedulers-build prometheus-build lint typecheck verify docs ## everything: set-up, lint, types, docs, every test tier
	PY=$(PY) dev/test-tiers.sh

.PHONY: test-quick
test-quick: venv checkov lint typecheck ## between full runs: lint, types and the unit tier (no cluster, no trainer processes)
	$(PY) -m pytest tests/unit -q

.PHONY: test-unit
test-unit: venv checkov ## tier 1: pure functions
	$(PY) -m pytest tests/unit

.PHONY: test-cluster
test-cluster: venv checkov cluster-build kueue-build schedulers-build ## tier 2: the real control plane with KWOK
	$(PY) -m pytest tests/cluster

.PHONY: test-trainer
test-trainer: venv ## tier 3: multi-process torch.distributed on CPU (+ trainer unit tests)
	$(PY) -m pytest tests/unit/trainer tests/trainer

.PHONY: test-e2e
test-e2e: venv deps deepspeed-ops cluster-build prometheus-build ## tier 4: training through the operator on this machine
	$(PY) -m pytest tests/e2e

.PHONY: test-helm
test-helm: venv checkov cluster-build ## chart: render/lint/schema tests, install/uninstall and the RBAC proof
	$(PY) -m pytest tests/unit/helm tests/cluster/test_helm_install.py tests/cluster/test_helm_rbac.py

.PHONY: test-images
test-images: venv ## static image checks; the operator image built and run (a venv replay where the builder cannot run); the trainer image replayed
	$(PY) -m pytest tests/images

.PHONY: lint-images
lint-images: venv ## hadolint the Dockerfiles
	$(VENV)/bin/hadolint Dockerfile trainer_image/Dockerfile trainer_image/Dockerfile.deepspeed

.PHONY: lock
lock: venv ## regenerate the images' hash-pinned dependency locks
	requirements/lock.sh

.PHONY: test-gpu
test-gpu: venv ## tier 5: GPU checks (skip without CUDA)
	$(PY) -m pytest -m gpu tests

# ---- the main job -------------------------------------------------------------

.PHONY: demo
demo: venv deps cluster-build prometheus-build cluster-up ## train a TrainingJob end to end on the local cluster
	$(PY) dev/demo.py

.PHONY: demo-down
demo-down: ## stop what the demo left running (agent, operator, Prometheus, TensorBoard)
	$(PY) dev/demo.py down

# ---- benchmarks ---------------------------------------------------------------

.PHONY: bench-operator
bench-operator: venv cluster-build ## operator vs. bare client at N jobs (JOBS=100)
	$(PY) benchmarks/bench_operator.py --jobs $${JOBS:-100}

.PHONY: bench-operator-huge
bench-operator-huge: venv cluster-build ## operator vs. bare client for one job of 1 master + 2,047 workers
	$(PY) benchmarks/bench_operator.py --jobs 1 --workers 2047

.PHONY: bench-trainer
bench-trainer: venv ## nanoGPT recipe, 1B Llama tokens/s + MFU vs compiled/eager plain loops, checkpoints; quick CPU run without a GPU
	if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; \
	then $(PY) benchmarks/bench_trainer.py --device cuda $${BENCH_ARGS:-}; \
	else $(PY) benchmarks/bench_trainer.py --device cpu --quick $${BENCH_ARGS:-}; fi

.PHONY: bench-elastic
bench-elastic: venv deps cluster-build ## e2e: seconds from a lost worker to training again, elastic vs. gang vs. in-place restart (REPEATS=2)
	$(PY) benchmarks/bench_elastic.py --repeats $${REPEATS:-2}

.PHONY: clean
clean: cluster-down ## remove the venv and cluster state (keeps the binary cache)
	rm -rf $(VENV) .cluster .cluster-e2e
