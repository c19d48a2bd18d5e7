"""cocotb + Verilator tests of ``stellar_pcie_usp`` (the NIC core behind the UltraScale+ PCIe
adapter) against cocotbext-pcie's RootComplex and hard-block model: enumeration and MMIO,
DMA both ways through real RoCE traffic (``stellar.sim.tb_pcie``)."""

import pytest
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import param_slug


def run(testcase, **params):
    from stellar.sim.pcie import pcie_verilog
    top, path, build = pcie_verilog()
    run_cocotb(toplevel=top, verilog_sources=[path], test_module="stellar.sim.tb_pcie",
               params_slug=param_slug(build), testcase=testcase, extra_env=tb_env(params))


@pytest.mark.parametrize("pause", [0.0, 0.3])
def test_pcie(pause):
    """Both benches in one simulator run per backpressure setting (one build)."""
    run("mmio,dma", pause=pause)
