"""Congestion control and QoS from the host: DCQCN parameters, traffic classes, tenant buckets and
the QoS profiles of the seed design.

Transport-agnostic like ``stellar.host.tables``: everything goes through ``regs.read32`` /
``regs.write32`` on the ``cc`` register block (``stellar.hdl.regmap``, documented there)::

    qos = Qos(regs)
    await qos.configure(us_cycles=250)                       # 250 MHz core clock
    await qos.set_dcqcn(ai_rate=40, time_reset=55)            # any RPG_* parameter by name
    cls = await qos.apply_profile(tenant=1, profile="ai_training")
    await tables.write_qp(i, ..., sl=cls, cc_mode=CcMode.DCQCN, weight=1)
    print(await qos.qp_state(i))

Rates are Mb/s everywhere (bits per microsecond), bursts bytes. Profiles state their figures for
a 100 Gb/s port (the seed design's) and are scaled to the configured line rate: ``ai_training``
guarantees 40 % of the line in class 7, ``inference`` 10 % in class 5. A profile's latency bound
is not enforced by the gateware: strict priority of its class is what serves it; the bench
reports the measured figure against it.
"""

from dataclasses import dataclass

from stellar.hdl.cc.sigmoid import fm_norm
from stellar.hdl.regmap import CC_CLASSES, REGMAP

__all__ = ["QosProfile", "PROFILES", "REFERENCE_LINE_MBPS", "DCQCN_PARAMS", "Qos", "QosError"]

REFERENCE_LINE_MBPS = 100_000      # the port the profiles' figures are written for

DCQCN_PARAMS = ("min_rate", "ai_rate", "hai_rate", "gd", "min_dec_fac", "threshold", "g_shift",
                "initial_alpha", "time_reset", "byte_reset", "alpha_period", "fm_a", "fm_b",
                "fm_c", "fm_period", "fm_cnp_gain", "fm_trend_gain")


class QosError(ValueError):
    """A QoS setting the device cannot hold (out of range, unknown name or profile)."""


@dataclass(frozen=True)
class QosProfile:
    name: str
    priority: int                  # traffic class = 802.1p priority = the QP's sl
    guarantee_mbps: int            # at REFERENCE_LINE_MBPS
    cap_mbps: int = 0              # 0: no cap
    latency_bound_us: float | None = None
    dscp: int | None = None        # None: 8 x priority (the class selector code point)

    def scaled(self, line_mbps):
        """(guarantee, cap) in Mb/s for a port of ``line_mbps``."""
        f = line_mbps / REFERENCE_LINE_MBPS
        return round(self.guarantee_mbps * f), round(self.cap_mbps * f)


PROFILES = {
    "ai_training": QosProfile("ai_training", priority=7, guarantee_mbps=40_000,
                              latency_bound_us=15.0),
    "inference": QosProfile("inference", priority=5, guarantee_mbps=10_000),
}


def _reg(name):
    return REGMAP[f"cc.{name}"]


class Qos:
    def __init__(self, regs, *, data_width=64):
        self.regs = regs
        self.data_width = data_width
        self.line_mbps = None

    async def _w(self, name, value):
        r = _reg(name)
        if not 0 <= value < (1 << r.width):
            raise QosError(f"cc.{name} = {value} does not fit in {r.width} bits")
        await self.regs.write32(r.offset, value)

    async def _r(self, name):
        return await self.regs.read32(_reg(name).offset)

    async def configure(self, *, us_cycles, line_mbps=None):
        """The time base (clock cycles per microsecond) and the line rate (default: the
        datapath's, data width x us_cycles Mb/s)."""
        await self._w("us_cycles", us_cycles)
        await self._w("max_rate", line_mbps or 0)
        self.line_mbps = line_mbps or self.data_width * us_cycles
        return self.line_mbps

    async def set_dcqcn(self, **params):
        """Reaction-point parameters by register name (``DCQCN_PARAMS``; FlowMatrix ones too).
        Changing ``fm_c`` rewrites ``fm_norm`` to match."""
        for name, value in params.items():
            if name not in DCQCN_PARAMS:
                raise QosError(f"unknown reaction-point parameter {name!r}; one of {DCQCN_PARAMS}")
            await self._w(name, value & 0xFFFF if name == "fm_c" else value)  # fm_c: signed
        if "fm_c" in params:
            await self._w("fm_norm", fm_norm(params["fm_c"] & 0xFFFF))

    async def set_cnp(self, *, interval_us=None, dscp=None, pcp=None):
        if interval_us is not None:
            await self._w("cnp_interval_us", interval_us)
        if dscp is not None or pcp is not None:
            cur = await self._r("cnp_marking")
            d = cur & 0x3F if dscp is None else dscp
            p = (cur >> 8) & 7 if pcp is None else pcp
            if not (0 <= d < 64 and 0 <= p < 8):
                raise QosError(f"CNP marking DSCP {d} / PCP {p} out of range")
            await self._w("cnp_marking", d | (p << 8))

    async def set_class_marking(self, cls, *, dscp, pcp=None, enable=True):
        """Traffic class ``cls`` sends with this DSCP and 802.1p priority (default ``cls``)."""
        if not 0 <= cls < CC_CLASSES:
            raise QosError(f"traffic class {cls} out of range 0..{CC_CLASSES - 1}")
        pcp = cls if pcp is None else pcp
        if not (0 <= dscp < 64 and 0 <= pcp < 8):
            raise QosError(f"DSCP {dscp} / PCP {pcp} out of range")
        await self._w(f"tc{cls}", dscp | (pcp << 6) | (int(enable) << 9))

    async def set_tenant(self, tenant, *, cap_mbps=0, guarantee_mbps=0, cap_burst=16384,
                         guarantee_burst=16384):
        """Token buckets of ``tenant``: a cap its QPs together cannot exceed (0: none) and a
        guaranteed rate served before other tenants of the same class (0: none)."""
        values = {"tenant_index": tenant, "tenant_cap_rate": cap_mbps,
                  "tenant_cap_burst": cap_burst, "tenant_guar_rate": guarantee_mbps,
                  "tenant_guar_burst": guarantee_burst}
        for name, value in values.items():      # every value checked before the first write
            if not 0 <= value < (1 << _reg(name).width):
                raise QosError(f"cc.{name} = {value} does not fit in {_reg(name).width} bits")
        await self._w("tenant_index", tenant)
        await self._w("tenant_cap_rate", cap_mbps)
        await self._w("tenant_cap_burst", cap_burst)
        await self._w("tenant_guar_rate", guarantee_mbps)
        await self._w("tenant_guar_burst", guarantee_burst)
        await self._w("tenant_command", 1)

    async def apply_profile(self, tenant, profile, *, line_mbps=None):
        """Program ``tenant`` with a profile (name or ``QosProfile``), scaled to the line rate;
        returns the traffic class its QPs must use (their ``sl``)."""
        if isinstance(profile, str):
            if profile not in PROFILES:
                raise QosError(f"unknown QoS profile {profile!r}; one of {sorted(PROFILES)}")
            profile = PROFILES[profile]
        line = line_mbps or self.line_mbps
        if line is None:
            raise QosError("call configure() first or pass line_mbps: profiles scale with it")
        guarantee, cap = profile.scaled(line)
        await self.set_tenant(tenant, cap_mbps=cap, guarantee_mbps=guarantee)
        dscp = 8 * profile.priority if profile.dscp is None else profile.dscp
        await self.set_class_marking(profile.priority, dscp=dscp)
        return profile.priority

    async def qp_state(self, index):
        """The reaction point's view of QP ``index``: rate, target, alpha, mode, stages."""
        await self._w("qp_index", index)
        flags = await self._r("qp_flags")
        return {"rate": await self._r("qp_rate"), "target": await self._r("qp_target"),
                "alpha": await self._r("qp_alpha"), "mode": flags & 3,
                "active": bool(flags >> 2 & 1), "timer_stage": flags >> 8 & 0xFF,
                "byte_stage": flags >> 16 & 0xFF}

    async def counters(self):
        return {r.name: await self._r(r.name) for r in REGMAP.block("cc").registers
                if r.access == "counter"}

    async def cnp_to_rate_cycles(self):
        """Clocks from the last CNP the reaction point took to its rate reaching the pacer."""
        return (await self._r("rate_stamp") - await self._r("cnp_stamp")) % (1 << 32)
