"""stellar.host.qos against a register file built from the register map: what the driver writes
where, profile scaling, range errors before any write."""

import asyncio

import pytest
from stellar.hdl.cc.sigmoid import fm_norm
from stellar.hdl.regmap import REGMAP
from stellar.host.qos import PROFILES, Qos, QosError


class Regs:
    def __init__(self):
        self.mem = {r.offset: r.init for r in REGMAP if r.access in ("rw", "ro")}
        self.log = []

    async def read32(self, off):
        return self.mem.get(off, 0)

    async def write32(self, off, value):
        self.log.append((REGMAP.at(off).name, value))
        self.mem[off] = value


def run(coro):
    return asyncio.run(coro)


def reg(regs, name):
    return regs.mem[REGMAP[name].offset]


def test_profiles_scale_to_line_rate_and_program_tenant_and_class():
    regs = Regs()
    q = Qos(regs, data_width=64)
    assert run(q.configure(us_cycles=250)) == 16000         # 64 bits x 250 MHz
    cls = run(q.apply_profile(3, "ai_training"))
    assert cls == 7
    # 40 Gb/s of a 100 Gb/s port = 40 % of 16 Gb/s
    assert reg(regs, "cc.tenant_guar_rate") == 6400
    assert reg(regs, "cc.tenant_cap_rate") == 0
    assert reg(regs, "cc.tenant_index") == 3
    assert regs.log[-1] == ("cc.tc7", 56 | (7 << 6) | (1 << 9))
    assert ("cc.tenant_command", 1) in regs.log
    assert run(q.apply_profile(4, "inference")) == 5
    assert reg(regs, "cc.tenant_guar_rate") == 1600
    assert PROFILES["ai_training"].latency_bound_us == 15.0


def test_dcqcn_parameters_and_fm_norm_follow_fm_c():
    regs = Regs()
    q = Qos(regs)
    run(q.set_dcqcn(ai_rate=40, time_reset=55, fm_c=-256))
    assert reg(regs, "cc.ai_rate") == 40 and reg(regs, "cc.time_reset") == 55
    assert reg(regs, "cc.fm_c") == 0xFF00
    assert reg(regs, "cc.fm_norm") == fm_norm(0xFF00)


def test_errors_before_touching_the_device():
    regs = Regs()
    q = Qos(regs)
    with pytest.raises(QosError):
        run(q.set_dcqcn(bogus=1))
    with pytest.raises(QosError):
        run(q.set_class_marking(8, dscp=1))
    with pytest.raises(QosError):
        run(q.set_class_marking(1, dscp=64))
    with pytest.raises(QosError):
        run(q.apply_profile(1, "nope"))
    with pytest.raises(QosError):
        run(q.apply_profile(1, "inference"))     # line rate unknown: configure() first
    with pytest.raises(QosError):
        run(q.set_tenant(1, cap_mbps=1 << 20))
    assert regs.log == []
