# tfde: `make demo` and `make test` set everything up on a fresh machine.
# `make help` lists the targets: each one's `## ` comment is its line there.
PYTHON ?= python3
# The environments live outside the checkout, keyed by what they install
# (tools/envs.py); the .venv* folders here are links to them.
ENVS := $(PYTHON) tools/envs.py
VENV := .venv
HVD_VENV := .venv-hvd
PY := $(VENV)/bin/python
TF215_VENV := .venv-tf215
TF215_PY := $(TF215_VENV)/bin/python
# Each environment's op library, compiled once per kernel sources
# (tools/envs.py ops NAME).
OPS_DIR := $(CURDIR)/build/ops
TF215_OPS := $(OPS_DIR)/tf215/_tfde_ops.so
# The TF 2.15 lane: the estimator tests and the graph-mode path (TF1
# sessions, DeepRec's feature columns, mxRec's door).
TF215_TESTS := tests/lanes/test_estimator.py tests/unit/test_graph_savers.py \
    tests/unit/test_keras_support.py tests/unit/test_mxrec.py tests/unit/test_feature_column.py
# The Keras 3 lanes: TensorFlow 2.16.2 and 2.17.1 (between 2.15's Keras 2
# and the main 2.21), each with Keras 3 and its own op library, run the
# Keras layer and the graph-mode path.
KERAS3_LANES := 216 217
KERAS3_LANE_TESTS := tests/unit/test_layers.py tests/unit/test_keras_support.py \
    tests/unit/test_graph_savers.py tests/unit/test_mxrec.py tests/unit/test_feature_column.py \
    tests/unit/test_deeprec.py
PYTEST_ARGS ?=
# The main suite runs in this many pytest worker processes, each taking
# whole test files (`--dist loadfile`: a file's module fixtures are built
# once). 2 halves the suite's time on a 2-core machine, where much of it is
# single-threaded tracing (3 was slower); TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
XDIST_ARGS := $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
PYTEST := $(PY) -m pytest -q -p no:cacheprovider --timeout=900
# What the main suite needs of the other environments.
SUITE_ENV := TFDE_REQUIRE_HOROVOD=1 TFDE_PEER_TESTS=1 TFDE_REQUIRE_PEERS=1 \
    TFDE_PEERS_PYTHON=$(CURDIR)/.venv-peers/bin/python

# One .PHONY line per group of targets, so that new targets add lines.
.PHONY: all help env ops envs hvd-env test test-main test-fast cuda-test gpu-test gpu-bench fuzz
.PHONY: test-unit test-distributed test-fuzz test-lanes lint reliability bench demo bazel clean
.PHONY: planner-bench
.PHONY: dtensor-test dtensor-bench
.PHONY: wheel wheel-test docs docs-env
.PHONY: delta-bench
.PHONY: tf215-env test-tf215 $(KERAS3_LANES:%=tf%-env) $(KERAS3_LANES:%=test-tf%)
.PHONY: peers-env

## all: the same as ops
all: ops

## help: this list of targets, one line each
help:
	@$(PYTHON) tools/make_help.py Makefile

## env: the main environment (TensorFlow 2.21 CPU, Keras 3, tf_keras, the test tools)
env:
	$(ENVS) env main

## ops: the op library against the main TensorFlow, in tfde/ops/
ops:
	$(ENVS) ops main --inplace

## hvd-env: TensorFlow 2.18.1 with Horovod 0.28.1 (Gloo), and its op library
hvd-env:
	$(ENVS) ops hvd

## tf215-env: TensorFlow 2.15.1, tf.estimator and Horovod, and its op library
tf215-env:
	$(ENVS) ops tf215

## tf216-env, tf217-env: TensorFlow 2.16.2 and 2.17.1 with Keras 3, and their op libraries
$(KERAS3_LANES:%=tf%-env): tf%-env:
	$(ENVS) ops tf$*

## peers-env: torch 2.13 and FBGEMM's CPU TBE, the peers of the benchmarks and tests
peers-env:
	$(ENVS) env peers

## docs-env: mkdocs and its plugins
docs-env:
	$(ENVS) env docs

## envs: every environment and op library `make test` uses (built once per machine)
envs:
	$(ENVS) ops main --inplace
	$(ENVS) ops hvd tf215 $(KERAS3_LANES:%=tf%)
	$(ENVS) env peers docs wheel

## test-tf215: the TF 2.15 lane (tf.estimator, the graph-mode path) on its op library
test-tf215: tf215-env
	TFDE_REQUIRE_HOROVOD=1 TFDE_OPS_LIBRARY=$(TF215_OPS) $(TF215_PY) -m pytest $(TF215_TESTS) \
	    -q -p no:cacheprovider -k "not reference" --timeout=900 $(PYTEST_ARGS)

# test-tf216, test-tf217: the work tree's tfde on that TensorFlow's op
# library (the twins' runs are the main suite's; here they would double
# the lane's time).
## test-tf216, test-tf217: the Keras 3 lanes on TensorFlow 2.16 and 2.17
$(KERAS3_LANES:%=test-tf%): test-tf%: tf%-env
	TFDE_OPS_LIBRARY=$(OPS_DIR)/tf$*/_tfde_ops.so .venv-tf$*/bin/python -m pytest \
	    $(KERAS3_LANE_TESTS) -q -p no:cacheprovider -k "not reference" --timeout=900 $(PYTEST_ARGS)

## test-lanes: the other TensorFlow versions' lanes (2.15, 2.16, 2.17)
test-lanes: test-tf215 $(KERAS3_LANES:%=test-tf%)

## wheel: a wheel of tfde for the main TensorFlow, packing the op library `make ops` built
WHEEL_VENV := .venv-wheel
wheel: ops
	rm -f dist/tfde-*.whl
	TFDE_PREBUILT_OPS=$(OPS_DIR)/main/_tfde_ops.so $(PY) -m pip wheel -q --no-deps \
	    --no-build-isolation -w dist .
	@ls dist/tfde-*.whl

# The environment holds the wheel's requirements only (tools/envs.py,
# built once per machine); the wheel goes in afresh each time, and pip
# adds what it requires beyond them.
## wheel-test: the wheel installed where only its requirements are (binaries only), then its smoke test
wheel-test: wheel
	$(ENVS) env wheel
	$(WHEEL_VENV)/bin/python -m pip uninstall -q -y tfde
	$(WHEEL_VENV)/bin/python -m pip install -q --disable-pip-version-check --only-binary :all: \
	    "$$(ls dist/tfde-*.whl)[cpu]"
	cd / && CC=false CXX=false $(CURDIR)/$(WHEEL_VENV)/bin/python $(CURDIR)/tests/packaging/wheel_smoke.py

## docs: the user guide built with warnings (and broken links) as errors
docs: docs-env
	NO_MKDOCS_2_WARNING=1 .venv-docs/bin/mkdocs build --strict --site-dir build/site

## lint: ruff over tfde/, tests/, bench/ and tools/ (pyproject.toml's rules)
lint: env
	$(VENV)/bin/ruff check tfde tests bench tools tfde_cli.py setup.py conftest.py

## test-main: the main suite (every kind of test but the lanes), two workers; each case's time in build/test-results/main.xml
test-main: ops hvd-env peers-env
	$(SUITE_ENV) $(PYTEST) tests tfde --doctest-modules $(XDIST_ARGS) --durations=15 \
	    --junitxml=build/test-results/main.xml $(PYTEST_ARGS)

## test-unit: the single-process tests and the doctests
test-unit: ops
	$(PYTEST) tests/unit tfde --doctest-modules $(XDIST_ARGS) $(PYTEST_ARGS)

## test-distributed: the multi-process tests (MultiWorkerMirrored, horovodrun)
test-distributed: ops hvd-env
	TFDE_REQUIRE_HOROVOD=1 TFDE_PEER_TESTS=1 $(PYTEST) tests/distributed $(XDIST_ARGS) $(PYTEST_ARGS)

## test-fuzz: the fuzz harness's fixed-seed cycle and its regression cases
test-fuzz: ops
	$(PYTEST) tests/fuzz $(PYTEST_ARGS)

## test: everything, each part timed: environments, lint, main suite, then the lanes, docs and wheel side by side
# The lanes, the wheel and the docs are one process each: side by side, as
# many at once as the cores this job may use, after the main suite (which
# takes them all).
test:
	@$(PYTHON) tools/timed.py "environments=$(MAKE) --no-print-directory envs" --then \
	    "lint=$(MAKE) --no-print-directory lint" --then \
	    "main suite=$(MAKE) --no-print-directory test-main" --then \
	    "lane tf215=$(MAKE) --no-print-directory test-tf215" \
	    $(foreach v,$(KERAS3_LANES),"lane tf$(v)=$(MAKE) --no-print-directory test-tf$(v)") \
	    "wheel=$(MAKE) --no-print-directory wheel-test" "docs=$(MAKE) --no-print-directory docs"

## test-fast: the main suite without the Horovod and peer environments
test-fast: ops
	$(PYTEST) tests tfde --doctest-modules $(XDIST_ARGS) $(PYTEST_ARGS)

## cuda-test: the CUDA launchers against the numpy oracles (needs nvcc and a GPU; skips without)
cuda-test:
	$(PYTHON) -m pytest --noconftest -q -p no:cacheprovider tests/unit/test_cuda_kernels.py

# Inside a CUDA-enabled TensorFlow on a GPU machine (`pip install
# 'tfde[gpu]'` there, or `make ops` with nvcc and tensorflow[and-cuda]):
# every GPU kernel against its twin, the pipeline on GPU tables against the
# numpy reference, and the op and sharding suites with the GPU as the
# default device.
GPU_PYTHON ?= $(PYTHON)
## gpu-test: every GPU kernel against its twin and the sharded path on GPU tables (GPU machine)
gpu-test:
	TF_FORCE_GPU_ALLOW_GROWTH=true $(GPU_PYTHON) -m pytest -q -p no:cacheprovider \
	  tests/unit/test_gpu.py tests/unit/test_ops.py tests/unit/test_ops_optimizers.py \
	  tests/unit/test_sharded.py tests/unit/test_forward_dedup.py

## gpu-bench: the GPU benchmark against tf.nn and torch on that GPU (GPU machine)
gpu-bench:
	TF_FORCE_GPU_ALLOW_GROWTH=true $(GPU_PYTHON) bench/gpu_bench.py
	TF_FORCE_GPU_ALLOW_GROWTH=true $(GPU_PYTHON) bench/gpu_bench.py --profile

# FUZZ_CASES generated malformed
# calls of every public op, each on the kernels and on the twins, in child
# processes; prints the cases tried, the distinct errors and every finding
# (crashes, wrong results, accepted malformed input, disallowed errors, state
# changed on an error, backends that disagree), and fails if there is one.
# Each run draws a new seed and prints it; FUZZ_SEED=S reproduces one.
# `make test` runs one fixed-seed cycle (tests/fuzz/test_fuzz.py) and the fixed
# findings of tests/fuzz/fuzz_regressions.py.
FUZZ_SEED ?=
FUZZ_CASES ?= 3340
## fuzz: a long fuzz run of every public op (FUZZ_CASES, FUZZ_SEED)
fuzz: ops
	$(PY) -m tests.fuzz.fuzz_cases $(if $(FUZZ_SEED),--seed $(FUZZ_SEED)) --cases $(FUZZ_CASES) $(FUZZ_ARGS)

## dtensor-test: tfde.dtensor with every optimizer on meshes of 1, 2, 4 and 2 x 2 devices
dtensor-test: ops
	TFDE_DTENSOR_FULL=1 $(PYTEST) tests/unit/test_dtensor.py

## dtensor-bench: the DTensor layer's benchmark
dtensor-bench: ops
	$(PY) bench/dtensor_bench.py

## reliability: the multi-process fault grid and the crash-safe saves with 40 kills per mode
reliability: ops hvd-env
	TFDE_PEER_TESTS=1 TFDE_REQUIRE_HOROVOD=1 TFDE_CRASH_TRIALS=40 $(PY) -m pytest -q -p no:cacheprovider \
	    --timeout=1800 tests/distributed/test_multiprocess_reliability.py tests/unit/test_crash_safe_saves.py

## bench: the benchmarks against their peers (quiet machine; outputs in bench/results/)
bench: ops peers-env hvd-env
	TFDE_PEERS_PYTHON=.venv-peers/bin/python $(PY) bench/ops_bench.py
	TFDE_PEERS_PYTHON=.venv-peers/bin/python $(PY) bench/forward_bench.py
	$(PY) bench/sharded_bench.py
	$(PY) bench/dynamic_bench.py
	$(PY) bench/memory_bench.py
	$(PY) bench/precision_bench.py --quick

## planner-bench: the planner's layout against all row-wise, table-wise and replicated ones
planner-bench: ops
	$(PY) bench/planner_bench.py --workers 2 $(PLANNER_BENCH_ARGS)

# (a few minutes, about 3 GB of memory and 1.5 GB of disk;
# `DELTA_BENCH_ARGS=--quick` for 1M rows).
## delta-bench: delta checkpoints against full ones on a 10M-row table
delta-bench: ops
	$(PY) bench/delta_bench.py $(DELTA_BENCH_ARGS)

## demo: the main job, a DLRM-style model on generated Criteo-like data, 2 replicas (reports/demo/)
demo: ops
	$(PY) -m tfde.app train --config configs/demo.yaml

# Offline with Debian's bazel-bootstrap (Bazel 4), whose rules_cc/rules_java
# are replaced by the forwarding shims in third_party/.
## bazel: the op library built with Bazel, then the op tests against it
bazel: env
	PYTHON_BIN_PATH=$(CURDIR)/$(PY) bazel build \
	    --override_repository=rules_cc=$(CURDIR)/third_party/rules_cc_shim \
	    --override_repository=rules_java=$(CURDIR)/third_party/rules_java_shim \
	    //:tfde_ops
	TFDE_OPS_LIBRARY=$(CURDIR)/bazel-bin/libtfde_ops.so $(PY) -m pytest -q \
	    -p no:cacheprovider tests/unit/test_ops.py tests/unit/test_ops_optimizers.py tests/unit/test_ops_refusals.py

## clean: build outputs and the links to the environments (the cache stays: tools/envs.py list)
clean:
	rm -rf build dist *.egg-info tfde/ops/_tfde_ops.so tfde/_build_info.py
	rm -f $(WHEEL_VENV) $(VENV) $(HVD_VENV) $(TF215_VENV) $(KERAS3_LANES:%=.venv-tf%) .venv-peers .venv-docs
