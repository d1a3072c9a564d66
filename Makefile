# tfde: `make demo` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV := .venv
HVD_VENV := .venv-hvd
PY := $(VENV)/bin/python
TF_VERSION := 2.21.0
HVD_TF_VERSION := 2.18.1
TF215_VENV := .venv-tf215
TF215_PY := $(TF215_VENV)/bin/python
# The TF 2.15 lane's op library: tfde's sources from the work tree run on it.
TF215_OPS := $(CURDIR)/$(TF215_VENV)/tfde_ops_tf215.so
# The TF 2.15 lane: the estimator tests and the graph-mode path (TF1
# sessions, DeepRec's feature columns, mxRec's door).
TF215_TESTS := tests/test_estimator.py tests/test_graph_savers.py tests/test_keras_support.py \
    tests/test_mxrec.py \
    tests/test_feature_column.py
# The Keras 3 lanes: TensorFlow 2.16.2 and 2.17.1 (between 2.15's Keras 2
# and the main 2.21), each with Keras 3 and its own op library, run the
# Keras layer and the graph-mode path.
KERAS3_LANES := 216 217
TF_VERSION_216 := 2.16.2
TF_VERSION_217 := 2.17.1
KERAS3_LANE_TESTS := tests/test_layers.py tests/test_keras_support.py tests/test_graph_savers.py \
    tests/test_mxrec.py tests/test_feature_column.py tests/test_deeprec.py
PYTEST_ARGS ?=
# The main suite runs in this many pytest worker processes, each taking
# whole test files (`--dist loadfile`: a file's module fixtures are built
# once). 2 halves the suite's time on a 2-core machine, where much of it is
# single-threaded tracing; TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
XDIST_ARGS := $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

# One .PHONY line per group of targets, so that new targets add lines.
.PHONY: all env ops hvd-env test test-fast cuda-test gpu-test gpu-bench fuzz reliability bench demo bazel clean
.PHONY: planner-bench
.PHONY: dtensor-test dtensor-bench
.PHONY: wheel wheel-test docs docs-env
.PHONY: delta-bench
.PHONY: tf215-env test-tf215 $(KERAS3_LANES:%=tf%-env) $(KERAS3_LANES:%=test-tf%)
.PHONY: peers-env

all: ops

# The main environment: TensorFlow 2.21 (CPU) and the test tools.
$(VENV)/.ready:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "tensorflow-cpu==$(TF_VERSION)" numpy absl-py pyyaml \
	    matplotlib pytest pytest-timeout setuptools wheel
	# keras-rs's configs are accepted by tfde (tests/test_tpu.py); keras-rs
	# needs only keras and ml-dtypes, which TensorFlow brings.
	$(VENV)/bin/pip install -q --no-deps keras-rs==0.4.0
	# tf_keras for tfde.dtensor (the extra `dtensor`), beside Keras 3:
	# `import keras` stays Keras 3. --no-deps: it asks for the `tensorflow`
	# distribution, which tensorflow-cpu already provides.
	$(VENV)/bin/pip install -q --no-deps "tf_keras==$(TF_VERSION)"
	touch $@

env: $(VENV)/.ready

# pytest-xdist for the suite's worker processes (a stamp of its own, so that
# environments made before it get it too).
$(VENV)/.xdist: $(VENV)/.ready
	$(VENV)/bin/pip install -q pytest-xdist
	touch $@

# The op library, built in place (editable install) against the main TF.
tfde/ops/_tfde_ops.so: $(VENV)/.ready $(wildcard kernels/*.cc kernels/*.h) setup.py
	$(VENV)/bin/pip install -q --no-build-isolation -e .
	@test -f $@

ops: tfde/ops/_tfde_ops.so

# The second environment: TensorFlow 2.18.1 with Horovod 0.28.1 (Gloo), the
# newest TF its CPU build supports, and tfde built and installed against it.
$(HVD_VENV)/.ready:
	$(PYTHON) -m venv $(HVD_VENV)
	$(HVD_VENV)/bin/pip install -q --upgrade pip
	$(HVD_VENV)/bin/pip install -q "tensorflow-cpu==$(HVD_TF_VERSION)" numpy absl-py \
	    pyyaml cmake setuptools wheel
	CMAKE_POLICY_VERSION_MINIMUM=3.5 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 \
	HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
	PATH=$(CURDIR)/$(HVD_VENV)/bin:$$PATH \
	    $(HVD_VENV)/bin/pip install -q --no-cache-dir --no-build-isolation horovod==0.28.1
	touch $@

$(HVD_VENV)/.tfde: $(HVD_VENV)/.ready $(wildcard kernels/*.cc kernels/*.h tfde/*.py tfde/*/*.py) setup.py
	PATH=$(CURDIR)/$(HVD_VENV)/bin:$$PATH $(HVD_VENV)/bin/pip install -q --no-build-isolation .
	touch $@

hvd-env: $(HVD_VENV)/.tfde

# The lowest supported TensorFlow: 2.15.1 with tensorflow-estimator 2.15.0
# (tf.estimator's last release) and its bundled Keras 2, and tfde's op
# library built against it (copied out to $(TF215_OPS)).
$(TF215_VENV)/.ready:
	$(PYTHON) -m venv $(TF215_VENV)
	$(TF215_VENV)/bin/pip install -q --upgrade pip
	$(TF215_VENV)/bin/pip install -q "tensorflow-cpu==2.15.1" "tensorflow-estimator==2.15.0" \
	    numpy absl-py pyyaml pytest pytest-timeout setuptools wheel
	touch $@

# Horovod 0.28.1 (Gloo) against TF 2.15 too: estimators under horovodrun
# (tests/test_estimator.py), where tf.estimator still exists. Both Horovod
# builds skip pip's cache: a wheel built against one TensorFlow refuses to
# load beside another.
$(TF215_VENV)/.horovod: $(TF215_VENV)/.ready
	$(TF215_VENV)/bin/pip install -q cmake
	CMAKE_POLICY_VERSION_MINIMUM=3.5 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 \
	HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
	PATH=$(CURDIR)/$(TF215_VENV)/bin:$$PATH \
	    $(TF215_VENV)/bin/pip install -q --no-cache-dir --no-build-isolation horovod==0.28.1
	touch $@

$(TF215_OPS): $(TF215_VENV)/.ready $(wildcard kernels/*.cc kernels/*.h) setup.py
	PATH=$(CURDIR)/$(TF215_VENV)/bin:$$PATH $(TF215_VENV)/bin/pip install -q --no-build-isolation .
	cp $$($(TF215_PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/tfde/ops/_tfde_ops.so $@

tf215-env: $(TF215_OPS) $(TF215_VENV)/.horovod

# The TF 2.15 lane: the work tree's tfde on TF 2.15's op library, on the
# kernels (the twins' TF1 runs are the main suite's; here they would double
# the lane's time).
test-tf215: tf215-env
	TFDE_REQUIRE_HOROVOD=1 TFDE_OPS_LIBRARY=$(TF215_OPS) $(TF215_PY) -m pytest $(TF215_TESTS) -q -p no:cacheprovider \
	    -k "not reference" --timeout=900 $(PYTEST_ARGS)

.venv-tf%/.ready:
	$(PYTHON) -m venv .venv-tf$*
	.venv-tf$*/bin/pip install -q --upgrade pip
	.venv-tf$*/bin/pip install -q "tensorflow-cpu==$(TF_VERSION_$*)" "keras==3.15.1" numpy absl-py pyyaml h5py \
	    pytest pytest-timeout setuptools wheel
	touch $@

.venv-tf%/tfde_ops.so: .venv-tf%/.ready $(wildcard kernels/*.cc kernels/*.h) setup.py
	PATH=$(CURDIR)/.venv-tf$*/bin:$$PATH .venv-tf$*/bin/pip install -q --no-build-isolation .
	cp $$(.venv-tf$*/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/tfde/ops/_tfde_ops.so $@

$(KERAS3_LANES:%=tf%-env): tf%-env: .venv-tf%/tfde_ops.so

# The work tree's tfde on that TensorFlow's op library, on the kernels.
$(KERAS3_LANES:%=test-tf%): test-tf%: tf%-env
	TFDE_OPS_LIBRARY=$(CURDIR)/.venv-tf$*/tfde_ops.so .venv-tf$*/bin/python -m pytest \
	    $(KERAS3_LANE_TESTS) -q -p no:cacheprovider \
	    -k "not reference" \
	    --timeout=900 $(PYTEST_ARGS)

# A wheel of tfde for the main TensorFlow: its op library compiled for that
# TensorFlow, its extras ([cpu], [gpu], [tpu]) pinned to that minor version
# (setup.py: tensorflow_extras). Compiling takes minutes on 2 cores.
WHEEL_VENV := .venv-wheel
wheel: $(VENV)/.ready
	rm -f dist/tfde-*.whl
	$(VENV)/bin/pip wheel -q --no-deps --no-build-isolation -w dist .
	@ls dist/tfde-*.whl

# The wheel in a fresh environment with that TensorFlow (from tfde[cpu]),
# binaries only (nothing compiles), then tests/wheel_smoke.py run from
# outside the checkout.
wheel-test: wheel
	rm -rf $(WHEEL_VENV)
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/pip install -q --only-binary :all: "$$(ls dist/tfde-*.whl)[cpu]"
	cd / && CC=false CXX=false $(CURDIR)/$(WHEEL_VENV)/bin/python $(CURDIR)/tests/wheel_smoke.py

# The user guide (docs/, mkdocs.yml) built with warnings as errors, in its
# own environment; tests/test_docs.py runs every code block in it.
DOCS_VENV ?= .venv-docs
$(DOCS_VENV)/.ready:
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install -q mkdocs mkdocs-material "mkdocstrings[python]"
	touch $@

docs-env: $(DOCS_VENV)/.ready

docs: $(DOCS_VENV)/.ready
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir build/site

# The whole suite: both op backends, MirroredStrategy over logical CPUs,
# 2-process MultiWorkerMirroredStrategy, and horovodrun in the TF 2.18 env;
# then the TF 2.15 lane (tf.estimator, the graph-mode path).
test: ops $(VENV)/.xdist hvd-env docs wheel-test tf215-env $(KERAS3_LANES:%=tf%-env) peers-env
	TFDE_REQUIRE_HOROVOD=1 TFDE_PEER_TESTS=1 TFDE_REQUIRE_PEERS=1 \
	TFDE_PEERS_PYTHON=$(PEERS_VENV)/bin/python $(PY) -m pytest tests tfde tfde_cli.py --doctest-modules -q -p no:cacheprovider \
	    $(XDIST_ARGS) --timeout=900 --durations=10 $(PYTEST_ARGS)
	$(MAKE) test-tf215
	$(MAKE) $(KERAS3_LANES:%=test-tf%)

# Without the Horovod environment (a few minutes quicker to set up).
test-fast: ops $(VENV)/.xdist
	$(PY) -m pytest tests tfde tfde_cli.py --doctest-modules -q -p no:cacheprovider \
	    $(XDIST_ARGS) --timeout=900 $(PYTEST_ARGS)

# The CUDA launchers against the numpy oracles, on a machine with nvcc and a
# GPU; needs neither TensorFlow nor this Makefile's environment (numpy and
# pytest suffice). Part of `make test` too, where it skips without a GPU.
cuda-test:
	$(PYTHON) -m pytest --noconftest -q -p no:cacheprovider tests/test_cuda_kernels.py

# Inside a CUDA-enabled TensorFlow on a GPU machine (`pip install
# 'tfde[gpu]'` there, or `make ops` with nvcc and tensorflow[and-cuda]):
# every GPU kernel against its twin, the pipeline on GPU tables against the
# numpy reference, and the op and sharding suites with the GPU as the
# default device; then the benchmark against tf.nn and torch on that GPU.
GPU_PYTHON ?= $(PYTHON)
gpu-test:
	TF_FORCE_GPU_ALLOW_GROWTH=true $(GPU_PYTHON) -m pytest -q -p no:cacheprovider \
	  tests/test_gpu.py tests/test_ops.py tests/test_ops_optimizers.py \
	  tests/test_sharded.py tests/test_forward_dedup.py

gpu-bench:
	TF_FORCE_GPU_ALLOW_GROWTH=true $(GPU_PYTHON) bench/gpu_bench.py
	TF_FORCE_GPU_ALLOW_GROWTH=true $(GPU_PYTHON) bench/gpu_bench.py --profile

# A long fuzz run (tests/fuzz_cases.py): FUZZ_CASES generated malformed
# calls of every public op, each on the kernels and on the twins, in child
# processes; prints the cases tried, the distinct errors and every finding
# (crashes, wrong results, accepted malformed input, disallowed errors, state
# changed on an error, backends that disagree), and fails if there is one.
# Each run draws a new seed and prints it; FUZZ_SEED=S reproduces one.
# `make test` runs one fixed-seed cycle (tests/test_fuzz.py) and the fixed
# findings of tests/fuzz_regressions.py.
FUZZ_SEED ?=
FUZZ_CASES ?= 3340
fuzz: ops
	$(PY) -m tests.fuzz_cases $(if $(FUZZ_SEED),--seed $(FUZZ_SEED)) --cases $(FUZZ_CASES) $(FUZZ_ARGS)

# tfde.dtensor: every optimizer on meshes of 1, 2 and 4 logical CPUs and a
# 2 x 2 "batch" x "model" mesh
# (`make test` runs each optimizer once), then its example.
dtensor-test: ops
	TFDE_DTENSOR_FULL=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_dtensor.py

dtensor-bench: ops
	$(PY) bench/dtensor_bench.py

# The multi-process reliability checks alone (`make test` runs them too):
# non-finite gradients across processes, and the grid of peers killed or
# stopped (2 and 4 processes, MultiWorkerMirroredStrategy and Horovod); and
# the crash-safe saves with 40 kills per mode (20 in `make test`).
reliability: ops hvd-env
	TFDE_PEER_TESTS=1 TFDE_REQUIRE_HOROVOD=1 TFDE_CRASH_TRIALS=40 $(PY) -m pytest -q -p no:cacheprovider \
	    --timeout=1800 tests/test_multiprocess_reliability.py tests/test_crash_safe_saves.py

# The peers of bench/ops_bench.py: torch CPU and FBGEMM TBE CPU matched to
# it (fbgemm-gpu-cpu 1.8 is built against torch 2.13), in their own env.
PEERS_VENV ?= .venv-peers
$(PEERS_VENV)/.ready:
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install -q "torch==2.13.0" "fbgemm-gpu-cpu==1.8.*" numpy
	touch $@
peers-env: $(PEERS_VENV)/.ready

bench: ops peers-env hvd-env
	TFDE_PEERS_PYTHON=$(PEERS_VENV)/bin/python $(PY) bench/ops_bench.py
	TFDE_PEERS_PYTHON=$(PEERS_VENV)/bin/python $(PY) bench/forward_bench.py
	$(PY) bench/sharded_bench.py
	$(PY) bench/dynamic_bench.py
	$(PY) bench/memory_bench.py
	$(PY) bench/precision_bench.py --quick

# The sharding planner's layout against all row-wise, table-wise and
# replicated layouts: many tables of mixed sizes on 2 and 4 logical CPUs
# (a few minutes; `PLANNER_BENCH_ARGS=--quick` for one).
planner-bench: ops
	$(PY) bench/planner_bench.py --workers 2 $(PLANNER_BENCH_ARGS)

# Delta checkpoints against full ones on a 10M-row table as the touched
# fraction grows (a few minutes, about 3 GB of memory and 1.5 GB of disk;
# `DELTA_BENCH_ARGS=--quick` for 1M rows). Plot: bench/results/delta_bench.png.
delta-bench: ops
	$(PY) bench/delta_bench.py $(DELTA_BENCH_ARGS)

# The main job: a DLRM-style model on generated Criteo-like data, 2 replicas,
# report in reports/demo/.
demo: ops
	$(VENV)/bin/tfde train --config configs/demo.yaml

# The same op library built with Bazel (BUILD, WORKSPACE), then the op tests
# run against it. Offline with Debian's bazel-bootstrap (Bazel 4), whose
# rules_cc/rules_java are replaced by the forwarding shims in third_party/.
bazel: $(VENV)/.ready
	PYTHON_BIN_PATH=$(CURDIR)/$(PY) bazel build \
	    --override_repository=rules_cc=$(CURDIR)/third_party/rules_cc_shim \
	    --override_repository=rules_java=$(CURDIR)/third_party/rules_java_shim \
	    //:tfde_ops
	TFDE_OPS_LIBRARY=$(CURDIR)/bazel-bin/libtfde_ops.so $(PY) -m pytest -q \
	    -p no:cacheprovider tests/test_ops.py tests/test_ops_optimizers.py tests/test_ops_refusals.py

clean:
	rm -rf build dist *.egg-info tfde/ops/_tfde_ops.so tfde/_build_info.py $(VENV) $(HVD_VENV) $(WHEEL_VENV) $(TF215_VENV) $(KERAS3_LANES:%=.venv-tf%)
