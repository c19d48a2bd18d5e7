"""The host driver (``stellar.host.verbs``) end to end through PCIe: cocotbext-pcie's root
complex and simulated host memory, ``stellar_pcie_usp`` with its queue engine, the NIC's wire
looped back through the switch model (``stellar.sim.tb_verbs``). ``stellar_pcie_usp`` runs as
NIC A of ``stellar_pcie2`` (the same ``PcieNic``), whose build the two-host tests share."""

import pytest
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import param_slug


def run(testcase, **params):
    # NIC A of the two-host top ``stellar_pcie2`` (the same PcieNic, 16 QPs, as
    # ``stellar_pcie_usp``, ports prefixed ``a_``; NIC B's clock never runs): the build that
    # test_twohost, test_endpoint_cocotb and test_cli_cocotb share, one Verilator model fewer.
    from stellar.sim.pcie import pcie_verilog
    top, path, build = pcie_verilog(two=True)
    run_cocotb(toplevel=top, verilog_sources=[path], test_module="stellar.sim.tb_verbs",
               params_slug=param_slug(build), testcase=testcase,
               extra_env=tb_env({**params, "prefix": "a"}))


@pytest.mark.parametrize("pause", [0.0, 0.3])
def test_verbs(pause):
    """Traffic, completions, MSI, MMIO counts; host-side and device-side errors and recovery."""
    run("traffic,errors", pause=pause)
