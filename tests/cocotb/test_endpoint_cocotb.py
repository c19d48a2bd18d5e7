"""The Endpoint API (``stellar.host.endpoint``) end to end on ``stellar_pcie2``: two simulated
PCIe hosts, their NICs joined by the switch model with a little loss, both endpoints opened from
one YAML peer file (``stellar.sim.tb_endpoint``)."""

import pytest
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import param_slug


def run(testcase, **params):
    from stellar.sim.pcie import pcie_verilog
    top, path, build = pcie_verilog(two=True)
    run_cocotb(toplevel=top, verilog_sources=[path], test_module="stellar.sim.tb_endpoint",
               params_slug=param_slug(build), testcase=testcase, extra_env=tb_env(params))


@pytest.mark.parametrize("pause", [0.0, 0.3])
def test_endpoint(pause):
    """Connect, exchange memory, blocking / non-blocking WRITE and READ with the data checked,
    QueueFull, barrier, RemoteAccessError on a corrupted rkey and recovery, QoS in the QP
    context."""
    run("endpoint", pause=pause)
