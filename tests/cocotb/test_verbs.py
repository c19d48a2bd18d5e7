"""The host driver (``stellar.host.verbs``) end to end through PCIe: cocotbext-pcie's root
complex and simulated host memory, ``stellar_pcie_usp`` with its queue engine, the NIC's wire
looped back through the switch model (``stellar.sim.tb_verbs``)."""

import pytest
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import param_slug


def run(testcase, **params):
    from stellar.sim.pcie import pcie_verilog
    top, path, build = pcie_verilog()
    run_cocotb(toplevel=top, verilog_sources=[path], test_module="stellar.sim.tb_verbs",
               params_slug=param_slug(build), testcase=testcase, extra_env=tb_env(params))


@pytest.mark.parametrize("pause", [0.0, 0.3])
def test_verbs(pause):
    """Traffic, completions, MSI, MMIO counts; host-side and device-side errors and recovery."""
    run("traffic,errors", pause=pause)
