"""Reaction-point parameters and per-QP state: names, widths, reset values, enum values.

Pure Python (no amaranth import), the one source of truth for ``stellar.hdl.cc.rp`` (its
``rp_params_layout()`` and ``rp_state_layout()`` are built from these tables), the register
map's reset values and the host driver (decoding the QP window). Semantics of every field:
``stellar.hdl.cc.rp``.

``RP_PARAM_FIELDS``: ``(name, width, signed)`` in layout order (first = least significant bits).
``RP_DEFAULTS``: the CSR reset values (DCQCN defaults of ConnectX firmware, FlowMatrix seed).
``RP_STATE_FIELDS``: ``(name, width)`` of the per-QP state word, in layout order.
"""

from ..flow.fields import CcMode
from .sigmoid import fm_norm

__all__ = ["RATE_BITS", "ALPHA_BITS", "MODE_NONE", "MODE_DCQCN", "MODE_FLOWMATRIX",
           "EV_INIT", "EV_CNP", "EV_SENT", "EV_TIMER", "RP_PARAM_FIELDS", "RP_DEFAULTS",
           "RP_STATE_FIELDS", "RP_STATE_BITS"]

RATE_BITS = 20      # Mb/s (bits per microsecond)
ALPHA_BITS = 20     # alpha fraction, 1.0 = 2**20

# Per-QP mode (the QP context's cc_mode). 3 is reserved and behaves like MODE_NONE.
MODE_NONE = int(CcMode.NONE)             # the QP context's cc_mode values (one source)
MODE_DCQCN = int(CcMode.DCQCN)
MODE_FLOWMATRIX = int(CcMode.FLOWMATRIX)

# Event kinds, in priority order (the trace's ``kind``).
EV_INIT = 0
EV_CNP = 1
EV_SENT = 2
EV_TIMER = 3

RP_PARAM_FIELDS = (
    ("max_rate",      RATE_BITS, False),   # line rate, Mb/s
    ("min_rate",      RATE_BITS, False),   # RPG_MIN_RATE, Mb/s
    ("ai_rate",       RATE_BITS, False),   # RPG_AI_RATE, Mb/s
    ("hai_rate",      RATE_BITS, False),   # RPG_HAI_RATE, Mb/s
    ("gd",            4,  False),          # RPG_GD: decrease = rc * (alpha >> 10) >> gd
    ("min_dec_fac",   7,  False),          # RPG_MIN_DEC_FAC, percent
    ("threshold",     4,  False),          # RPG_THRESHOLD (F)
    ("g_shift",       4,  False),          # alpha gain g = 2**-g_shift
    ("initial_alpha", 10, False),          # 1/1024 units
    ("time_reset",    16, False),          # RPG_TIME_RESET, us
    ("byte_reset",    24, False),          # RPG_BYTE_RESET, bytes
    ("alpha_period",  16, False),          # us
    ("fm_a",          16, False),          # FlowMatrix a, Q0.16
    ("fm_b",          16, False),          # FlowMatrix b, Q8.8
    ("fm_c",          16, True),           # FlowMatrix c, signed Q8.8
    ("fm_period",     16, False),          # us
    ("fm_cnp_gain",   16, False),          # Q8.8 per CNP
    ("fm_trend_gain", 16, False),          # Q8.8 per PSN of in-flight growth
    ("fm_norm",       32, False),          # Q16.16, sigmoid.fm_norm(fm_c)
)

_FM_C = round(0.5 * 256)

RP_DEFAULTS = {
    "max_rate": 16000,          # 64-bit datapath at 250 MHz
    "min_rate": 1,
    "ai_rate": 5,
    "hai_rate": 50,
    "gd": 11,
    "min_dec_fac": 50,
    "threshold": 5,
    "g_shift": 8,
    "initial_alpha": 1023,
    "time_reset": 300,
    "byte_reset": 32767,
    "alpha_period": 55,
    "fm_a": round(0.7 * 65536),
    "fm_b": round(0.3 * 256),
    "fm_c": _FM_C,
    "fm_period": 10,
    "fm_cnp_gain": 256,
    "fm_trend_gain": 32,
    "fm_norm": fm_norm(_FM_C),
}

RP_STATE_FIELDS = (
    ("mode",      2),           # MODE_*
    ("active",    1),           # DCQCN: rate limited (timers and byte counter run)
    ("rc",        RATE_BITS),   # current rate, Mb/s (the rate output)
    ("rt",        RATE_BITS),   # DCQCN target rate, Mb/s
    ("alpha",     ALPHA_BITS),  # DCQCN alpha, 1.0 = 2**20
    ("t_alpha",   32),          # DCQCN: now_us of the last alpha update
    ("t_rate",    32),          # DCQCN: now_us of the last rate-timer expiry
    ("byte_cnt",  24),          # DCQCN: bytes towards the next byte-counter expiry
    ("it",        8),           # DCQCN: timer stage (saturating)
    ("ib",        8),           # DCQCN: byte stage (saturating)
    ("w",         16),          # FlowMatrix weight W, Q0.16
    ("cnps",      8),           # FlowMatrix: CNPs in the current period (saturating)
    ("infl_prev", 16),          # FlowMatrix: in-flight PSNs at the last periodic update
    ("infl_last", 16),          # FlowMatrix: in-flight PSNs of the last request sent
    ("t_fm",      32),          # FlowMatrix: now_us of the last periodic update
)

RP_STATE_BITS = sum(w for _, w in RP_STATE_FIELDS)
