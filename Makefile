# The two set-up commands: `make demo` and `make test`. Both work as root on a fresh Debian 12 machine.
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
# Debian's interpreter, not a per-user one (pyenv under /root): jobs and prolog run the venv as other users.
PYTHON ?= /usr/bin/python3.11
STATE := $(CURDIR)/.devcluster
DEEPSPEED_VERSION := 0.19.8
export NURO_DEVCLUSTER_DIR := $(STATE)

.PHONY: venv demo test unit integration lint bench up down clean packages

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11 python3.11-venv)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	# torch first, pinned: the CPU wheel on disk (an open range would fetch a multi-GB CUDA build)
	$(PY) -m pip install -q torch==2.13.0 numpy
	# DeepSpeed with the op it needs on CPU (shared-memory comm) built now, into this root-owned venv: no job ever
	# compiles it (a JIT cache would have to be writable by every team, docs/deepspeed.md). The build must see this
	# torch (--no-build-isolation) and a C++ compiler with Python's headers.
	command -v g++ >/dev/null && test -f /usr/include/python3.11/Python.h || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ python3.11-dev)
	$(PY) -c 'from deepspeed.git_version_info import installed_ops as o; assert o["deepspeed_shm_comm"]' 2>/dev/null || \
	  DS_ACCELERATOR=cpu DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 $(PY) -m pip install -q --no-build-isolation \
	    --no-cache-dir --no-binary deepspeed -c <(echo torch==2.13.0) 'deepspeed==$(DEEPSPEED_VERSION)'
	$(PY) -m pip install -q -e '.[test]'
	touch $@

up: venv
	$(VENV)/bin/nuro-admin devcluster up

down:
	test ! -x $(VENV)/bin/nuro-admin || $(VENV)/bin/nuro-admin devcluster down

# make demo: the DDP job; make demo DEMO=deepspeed: the DeepSpeed ZeRO-2 job (examples/train_deepspeed)
DEMO ?= ddp
demo: venv
	$(PY) examples/demo.py --example $(DEMO)

lint: venv
	$(VENV)/bin/ruff check .

unit: venv
	$(PY) -m pytest tests/unit -q

# The whole suite: lint, unit tests, then the integration tests on a real local cluster the tests bring up.
# Own temp base per checkout, outside it (tests need directories that are not inside a git repository): pytest
# re-sets /tmp/pytest-of-root to 0700 at every root session, which would cut a concurrent session's job users off.
# Named by a hash of the checkout path, not the path itself: short and unique however deep the clone is.
BASETEMP := /tmp/nuro-pytest-$(shell printf '%s' '$(CURDIR)' | sha256sum | cut -c1-12)
# The unit tests first, on both cores (pytest-xdist: pure code, no cluster yet). Then the integration and e2e tests in
# four shards side by side, each one pytest process with its own cluster (port base, state dir, temp base): the suite
# waits on Slurm far more than it computes (process accounting over a three-shard run, 2026-12-06: 65 % of the two
# cores busy). Shards A and B run on the host's Slurm 22.05: B is the listed files (controller, detector, isolation,
# submit, prolog, ...), A everything else (new files too). Shards C24 and C26 (below) run the every_slurm tests on
# 24.11 and 26.05, then the NEWER_EXTRA files of their version. Balanced by measured time (2026-12-06, three shards:
# A 1,140 s, B 1,090 s, C 914 s; the DeepSpeed, MLflow and in-memory snapshot files added since 2026-12-04 had grown A
# and B by ~50 %). Fixed port bases used by single modules (checkpoints/staging 8800, lifecycle 24800-25100, MLflow
# 9460/9465) stay in one shard each. All shards always run; make fails if any failed; each shard's output is printed
# whole when it ends.
UNIT_WORKERS ?= 2
SHARD_B := tests/integration/test_controller.py \
	tests/integration/test_failure_detector.py tests/integration/isolation tests/integration/test_submit.py \
	tests/integration/test_prolog.py tests/integration/test_healthcheck.py tests/integration/test_nodeagent.py \
	tests/integration/test_adapter_live.py tests/integration/test_cluster.py tests/e2e/test_stragglers.py
SHARD_B_ENV := NURO_TEST_PORT_BASE=26800 NURO_TEST_CLUSTER_DIR=$(CURDIR)/.devcluster-test-b
# The dev cluster's Debian packages (lua5.1 among them) before the unit tests too: the job_submit.lua vectors run
# through lua5.1 there, and on a fresh machine the cluster (which would install it) only comes up afterwards.
packages: venv
	$(PY) -c 'from nuro.devcluster.install import ensure_packages; ensure_packages()'

# Slurm 24.11 and 26.05 (issue 14): the Slurm-facing tests (marker every_slurm: adapter, bridge vectors, policy apply,
# controller, detector, prolog/epilog, the e2e crash/resume) run again on each newer version, side by side as shards
# C24 (port base 28800) and C26 (30800) beside A and B, each on a cluster whose Slurm runs from a cached Debian root
# filesystem (built on first use, ~40 s each; `nuro-admin devcluster rootfs` shows build time and size). 24.11 runs
# on topology/tree (topology.conf) and 26.05 on topology/block (topology.yaml), so the placement test proves both
# plugins. After its every_slurm tests each runs NEWER_EXTRA_<version>: files whose subject is not Slurm's version
# (metrics, S3 read caps, straggler drain; MLflow tracking, in-memory snapshots), run there instead of on
# 22.05 in A or B, in a second pytest session (the cluster comes up again, ~20 s). `make test SLURM=26.05` runs the
# unit tests and only the every_slurm tests, on that version (TOPOLOGY=block for topology/block).
SLURM ?=
TOPOLOGY ?= tree
NEWER_EXTRA_24.11 := tests/integration/test_metrics_run.py \
	tests/integration/test_s3_read_caps.py tests/integration/test_straggler_drain.py
NEWER_EXTRA_26.05 := tests/integration/test_tracking.py tests/integration/test_tracking_auth.py \
	tests/e2e/test_snapshots.py
SHARD_C_ENV := NURO_TEST_PORT_BASE=28800 NURO_TEST_CLUSTER_DIR=$(CURDIR)/.devcluster-test-c
UNIT_TESTS := $(PY) -m pytest tests/unit -q -n $(UNIT_WORKERS) --durations=10 --basetemp=$(BASETEMP)
EVERY_SLURM := $(PY) -m pytest tests --ignore=tests/unit -m every_slurm -q --durations=15
# $(call newer_shard,VERSION,TOPOLOGY,PORT_BASE): that shard's two sessions, its output in $(BASETEMP)-c<VERSION>.log
newer_env = NURO_TEST_SLURM=$(1) NURO_TEST_TOPOLOGY=$(2) NURO_TEST_PORT_BASE=$(3) \
	NURO_TEST_CLUSTER_DIR=$(CURDIR)/.devcluster-test-$(3)
newer_shard = ( crc=0; echo "== every_slurm"; \
	$(call newer_env,$(1),$(2),$(3)) $(EVERY_SLURM) --basetemp=$(BASETEMP)-c$(1) || crc=1; \
	echo "== $(NEWER_EXTRA_$(1))"; $(call newer_env,$(1),$(2),$(3)) $(PY) -m pytest $(NEWER_EXTRA_$(1)) -q \
	  --durations=15 --basetemp=$(BASETEMP)-c$(1)x || crc=1; exit $$crc ) > $(BASETEMP)-c$(1).log 2>&1

ifneq ($(SLURM),)
test: venv lint packages
	rc=0; \
	$(UNIT_TESTS) || rc=1; \
	NURO_TEST_SLURM=$(SLURM) NURO_TEST_TOPOLOGY=$(TOPOLOGY) $(SHARD_C_ENV) $(EVERY_SLURM) \
	  --basetemp=$(BASETEMP)-$(SLURM) || rc=1; \
	$(VENV)/bin/nuro-admin devcluster rootfs; \
	exit $$rc
else
test: venv lint packages
	rc=0; \
	$(UNIT_TESTS) || rc=1; \
	$(PY) -m pytest tests --ignore=tests/unit $(addprefix --ignore=,$(SHARD_B) $(NEWER_EXTRA_24.11) \
	  $(NEWER_EXTRA_26.05)) -q --durations=25 \
	  --basetemp=$(BASETEMP)-a > $(BASETEMP)-a.log 2>&1 & a=$$!; \
	$(SHARD_B_ENV) $(PY) -m pytest $(SHARD_B) -q --durations=25 --basetemp=$(BASETEMP)-b > $(BASETEMP)-b.log 2>&1 & \
	b=$$!; \
	$(call newer_shard,24.11,tree,28800) & c24=$$!; \
	$(call newer_shard,26.05,block,30800) & c26=$$!; \
	wait $$a || rc=1; echo "== integration shard A"; cat $(BASETEMP)-a.log; \
	wait $$b || rc=1; echo "== integration shard B (NURO_TEST_PORT_BASE=26800)"; cat $(BASETEMP)-b.log; \
	wait $$c24 || rc=1; echo "== shard C24: Slurm 24.11, topology/tree (28800)"; cat $(BASETEMP)-c24.11.log; \
	wait $$c26 || rc=1; echo "== shard C26: Slurm 26.05, topology/block (30800)"; cat $(BASETEMP)-c26.05.log; \
	$(VENV)/bin/nuro-admin devcluster rootfs; \
	exit $$rc
endif

bench: venv
	$(PY) bench/run_all.py

# --purge also removes the cluster's short socket dir (/run/nuro-dc-<hash>), which is outside the checkout.
clean:
	test ! -x $(VENV)/bin/nuro-admin || $(VENV)/bin/nuro-admin devcluster down --purge
	rm -rf $(VENV) $(STATE)
