# Every target creates .venv in the repository root when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Bytecode is written, as Python does by default, even where the environment says not to
# (PYTHONDONTWRITEBYTECODE): a make test starts about 400 Python processes (brokers,
# controllers, runners, test workers), and without it each compiled every module of ours it
# imported again (0.2 s of a broker's start; pytest's collection 12.9 against 7.2 CPU-s).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install test lint demo broker-demo bench reliability images e2e-pods mutations clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	-$(BIN)/python -m undertow_analysis.class_archive
	touch $(STAMP)

install: $(STAMP)

# Three pytest-xdist workers on any machine: the suite waits on brokers, clients and Spark
# as much as it computes, and three kept two cores busier than two (911 s against 1,109 s,
# 2026-11-28); a test file stays on one worker (module fixtures, its Spark session).
# pytest-xdist hands files out by their number of tests, which mixes the heavy files (whole
# experiments, Spark, the library simulated) with light ones; handing the heavy ones out
# first (--no-loadscope-reorder) ran them side by side and took 1,094-1,116 s against
# 884-920 s (benchmarks/RESULTS.md, "make test").
PYTEST_WORKERS ?= 3

test: lint
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=25

# ruff, then vulture for dead code (paths and the names it must not report: pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/vulture

# The main job: the same leader kills with acks=1 (loses acknowledged records) and with
# acks=all + min.insync.replicas=2 (loses none), each ending with its loss report.
demo: $(STAMP)
	rm -rf runs/demo-acks1 runs/demo-acksall
	$(BIN)/undertow run experiments/acks1-leader-kill.yaml --out runs/demo-acks1
	$(BIN)/undertow run experiments/acksall-leader-kill.yaml --out runs/demo-acksall

# A local 3-broker cluster, a stock client, the describe table (no faults).
broker-demo: $(STAMP)
	$(BIN)/python -m minibroker.demo

reliability: $(STAMP)
	$(BIN)/python benchmarks/experiment_reliability.py --runs 20

# The three images (minibroker, operator, analysis) tagged with the chart's appVersion, with
# Docker where a Docker engine runs, else podman (scripts/images.sh); local only unless
#   make images IMAGE_REGISTRY=registry.example.com/team   also tags and pushes them there
#   make images KIND_CLUSTER=NAME                          loads them into that kind cluster
# (IMAGES_DRY_RUN=1 prints the commands instead).
images:
	scripts/images.sh

# The images built (scripts/images.sh) and run as the operator renders them (tests/containers);
# then acks1-leader-kill, acksall-leader-kill, pod-delete-ephemeral, pod-delete-persistent,
# disk-full-leader-acksall, group-coordinator-kill and txn-partition-leader-kill on the
# operator's own pods under podman (tests/pods): they must give loss, clean, loss, clean,
# clean, clean and clean, as they do locally;
# then pause, partition and disk stall through the pods' fault agents, and a delay whose added
# round trip is measured inside the containers (within 20 %). make test skips both
# folders: building the images takes minutes on a fresh machine.
e2e-pods: $(STAMP)
	UNDERTOW_E2E_PODS=1 $(BIN)/pytest -q -p no:cacheprovider tests/containers tests/pods

# Each named mutation of scripts/mutations.py (the election order, the high watermark, the
# coordinator's load, the fetch session, the anomaly definitions, the simulator's delay)
# applied to a copy of HEAD, and the tests of its area run on it: fails if one survives.
# Not part of make test (minutes of a core); .ci/run runs it after make test, and its last
# result is in benchmarks/RESULTS.md ("mutations").
mutations: $(STAMP)
	$(BIN)/python scripts/mutations.py

bench: $(STAMP)
	$(BIN)/python benchmarks/broker_produce.py
	$(BIN)/python benchmarks/analysis_scale.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info runs
