"""cocotb + Verilator tests of ``stellar_pcie_usp`` (the NIC core behind the UltraScale+ PCIe
adapter) against cocotbext-pcie's RootComplex and hard-block model: enumeration and MMIO,
DMA both ways through real RoCE traffic (``stellar.sim.tb_pcie``)."""

import functools

import pytest
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import export_verilog, param_slug


@functools.cache
def top_verilog(qps=16):
    from stellar.hdl.top.pcie import TOP_NAME, verilog_top
    return export_verilog(TOP_NAME, verilog_top, {"qps": qps})


def run(testcase, **params):
    from stellar.hdl.top.pcie import TOP_NAME
    run_cocotb(toplevel=TOP_NAME, verilog_sources=[top_verilog()], test_module="stellar.sim.tb_pcie",
               params_slug=param_slug({"qps": 16}), testcase=testcase, extra_env=tb_env(params))


@pytest.mark.parametrize("pause", [0.0, 0.3])
def test_pcie(pause):
    """Both benches in one simulator run per backpressure setting (one build)."""
    run("mmio,dma", pause=pause)
