"""Bit-exact reference model of the per-QP congestion reaction point (DCQCN and FlowMatrix).

Pure Python, written from the reaction point's specification (the module docstring of
``stellar.hdl.cc.rp``), not from its gateware: the tests replay the events the gateware traced
into this model and compare every rate it emits and, at the end, every QP's state word.

Rules the specification settles that a first reading might get wrong (all in that docstring):
timestamps are due when ``(now - t) mod 2**32`` is below 2**31 and at least the period;
increase() averages ``(rt + rc + 1) >> 1`` (half up, so a QP does reach max_rate and goes
inactive); rc, alpha and byte_cnt saturate instead of wrapping; a FlowMatrix CNP updates at once
but only the periodic update clears ``cnps`` and moves ``infl_prev``; a QP in mode 3 acts like
mode 0.

Units: rates Mb/s (20-bit), time ``now`` in microseconds (32-bit, wraps), alpha Q0.20, FlowMatrix
weight Q0.16, congestion signal Q8.8. ``params`` is a dict with the names of
``stellar.hdl.cc.params.RP_PARAM_FIELDS`` (``fm_c`` as a signed int or as its 16 raw bits).

Usage::

    m = RpModel(qps=16, params=RP_DEFAULTS)
    m.init(qp, mode, now)            # -> rate emitted (int) or None, same for every event
    m.cnp(qp, now); m.sent(qp, nbytes, inflight, now); m.timer(qp, now)
    m.event(kind, qp, now, mode=, nbytes=, inflight=)   # by EV_* kind (trace replay)
    m.state[qp]                      # dict of the RP_STATE_FIELDS
    m.timer_due(qp, now)             # would a TIMER at ``now`` change anything
"""

import math

__all__ = ["RpModel", "model_sigmoid_table", "elapsed_due"]

_RATE_MAX = (1 << 20) - 1
_ALPHA_ONE = 1 << 20
_T32 = 1 << 32


def model_sigmoid_table():
    """The FlowMatrix table from its definition: entry i = sigmoid(-8 + i/16) in Q0.16,
    round(65535 / (1 + e^-x)) (half up), at most 65535."""
    out = []
    for i in range(256):
        v = 65535.0 / (1.0 + math.exp(-(-8.0 + i / 16.0)))
        out.append(min(65535, int(math.floor(v + 0.5))))
    return out


def elapsed_due(now, t, period):
    """``now - t`` modulo 2**32 has reached ``period``; an elapsed time of 2**31 or more
    counts as "not yet" (``t`` is in the future)."""
    e = (now - t) % _T32
    return e < (1 << 31) and e >= period


def _sat(v, hi):
    return hi if v > hi else v


class RpModel:
    FIELDS = ("mode", "active", "rc", "rt", "alpha", "t_alpha", "t_rate", "byte_cnt", "it", "ib",
              "w", "cnps", "infl_prev", "infl_last", "t_fm")

    def __init__(self, qps, params):
        self.qps = qps
        self.p = dict(params)
        c = self.p["fm_c"] & 0xFFFF
        self.p["fm_c"] = c - 0x10000 if c & 0x8000 else c
        self.table = model_sigmoid_table()
        # Reset: every state field zero (mode NONE).
        self.state = [dict.fromkeys(self.FIELDS, 0) for _ in range(qps)]

    # ------------------------------------------------------------------ helpers
    def _sig_index(self, x):
        i = math.floor(x / 16) + 128          # x is Q8.8: steps of 1/16 = 16 units
        return max(0, min(255, i))

    def sigma0(self):
        return self.table[self._sig_index(self.p["fm_c"])]

    def timer_due(self, qp, now):
        s, p = self.state[qp], self.p
        if s["mode"] == 1:
            return bool(s["active"]) and (elapsed_due(now, s["t_alpha"], p["alpha_period"])
                                          or elapsed_due(now, s["t_rate"], p["time_reset"]))
        if s["mode"] == 2:
            return elapsed_due(now, s["t_fm"], p["fm_period"])
        return False

    # ------------------------------------------------------------------ events
    def event(self, kind, qp, now, *, mode=0, nbytes=0, inflight=0):
        if kind == 0:
            return self.init(qp, mode, now)
        if kind == 1:
            return self.cnp(qp, now)
        if kind == 2:
            return self.sent(qp, nbytes, inflight, now)
        return self.timer(qp, now)

    def init(self, qp, mode, now):
        p = self.p
        s = self.state[qp]
        s.update(mode=mode, active=0, rc=p["max_rate"], rt=p["max_rate"],
                 alpha=p["initial_alpha"] * 1024, t_alpha=now, t_rate=now, byte_cnt=0, it=0, ib=0,
                 w=self.sigma0(), cnps=0, infl_prev=0, infl_last=0, t_fm=now)
        return s["rc"]

    def cnp(self, qp, now):
        s = self.state[qp]
        if s["mode"] == 1:
            return self._dcqcn_cnp(s, now)
        if s["mode"] == 2:
            s["cnps"] = _sat(s["cnps"] + 1, 255)
            return self._fm_update(s, now, periodic=False)
        return None

    def sent(self, qp, nbytes, inflight, now):
        s, p = self.state[qp], self.p
        if s["mode"] == 1:
            if not s["active"]:
                return None
            total = s["byte_cnt"] + nbytes
            if total >= p["byte_reset"]:
                s["byte_cnt"] = _sat(total - p["byte_reset"], (1 << 24) - 1)
                s["ib"] = _sat(s["ib"] + 1, 255)
                return self._increase(s)
            s["byte_cnt"] = _sat(total, (1 << 24) - 1)
            return None
        if s["mode"] == 2:
            s["infl_last"] = inflight
        return None

    def timer(self, qp, now):
        s, p = self.state[qp], self.p
        if s["mode"] == 1:
            if not s["active"]:
                return None
            if elapsed_due(now, s["t_alpha"], p["alpha_period"]):
                s["alpha"] = s["alpha"] - (s["alpha"] >> p["g_shift"])
                s["t_alpha"] = now
            if elapsed_due(now, s["t_rate"], p["time_reset"]):
                s["it"] = _sat(s["it"] + 1, 255)
                s["t_rate"] = now
                return self._increase(s)
            return None
        if s["mode"] == 2:
            if elapsed_due(now, s["t_fm"], p["fm_period"]):
                return self._fm_update(s, now, periodic=True)
        return None

    # ------------------------------------------------------------------ DCQCN
    def _dcqcn_cnp(self, s, now):
        p = self.p
        rc = s["rc"]
        a10 = s["alpha"] // 1024
        dec = (rc * a10) // (2 ** p["gd"])
        floor = (rc * p["min_dec_fac"] * 1311) // (2 ** 17)
        s["rt"] = rc
        s["rc"] = min(max(rc - dec, floor, p["min_rate"]), _RATE_MAX)   # floor > rc when min_dec_fac > 100
        s["alpha"] = min(s["alpha"] + (_ALPHA_ONE - s["alpha"]) // (2 ** p["g_shift"]), _ALPHA_ONE - 1)
        s.update(t_alpha=now, t_rate=now, byte_cnt=0, it=0, ib=0, active=1)
        return s["rc"]

    def _increase(self, s):
        p = self.p
        F = p["threshold"]
        hi, lo = max(s["it"], s["ib"]), min(s["it"], s["ib"])
        rt = s["rt"]
        if hi < F:
            pass                                   # fast recovery
        elif lo >= F:
            rt += p["hai_rate"] * (lo - F + 1)     # hyper increase
        else:
            rt += p["ai_rate"]                     # additive increase
        rt = min(rt, p["max_rate"])
        s["rt"] = rt
        s["rc"] = (rt + s["rc"] + 1) // 2           # half up: rt = max_rate pulls rc all the way
        if s["rc"] == p["max_rate"]:
            s["active"] = 0
        return s["rc"]

    # ------------------------------------------------------------------ FlowMatrix
    def _fm_update(self, s, now, *, periodic):
        p = self.p
        d = (s["infl_last"] - s["infl_prev"]) % 65536
        trend = d if 0 < d < 32768 else 0           # positive as a signed 16-bit value
        q = min(p["fm_cnp_gain"] * s["cnps"] + p["fm_trend_gain"] * trend, 65535)
        x = (p["fm_b"] * q) // 256 + p["fm_c"]
        sig = self.table[self._sig_index(x)]
        s["w"] = (p["fm_a"] * s["w"] + (65536 - p["fm_a"]) * sig) // 65536
        r = (p["max_rate"] * (65536 - s["w"]) * p["fm_norm"]) // _T32
        r = min(r, p["max_rate"])
        r = max(r, p["min_rate"])
        s["rc"] = r
        if periodic:
            s["cnps"] = 0
            s["infl_prev"] = s["infl_last"]
            s["t_fm"] = now
        return r
