# Ref: DCQCN (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015);
#      NVIDIA ConnectX firmware DCQCN parameters (RPG_*); IBTA Vol 1 Annex A17.9 (RoCEv2 CC)
"""Per-QP congestion reaction point: DCQCN, or the experimental FlowMatrix update, sets each QP's
sending rate from the CNPs it receives, the bytes it sends and the passing of time.

One event machine owns the per-QP state RAM and handles one event at a time::

    init (host set up a QP) --> FIFO 4 --+
    cnp  (a CNP arrived)    --> FIFO 8 --+--> [issue] -> [S1 read] -> [S2] -> [S3] -> [S4 write] --> rate
    sent (request sent)     --> FIFO 8 --+     priority          state RAM      (FlowMatrix:      --> trace
    timer scanner (1 QP / clock) -> slot-+     init>cnp>sent>timer               F5 .. F12 write)

Units: rates are unsigned 20-bit Mb/s (bits per microsecond); ``now_us`` counts microseconds
(32-bit, wrapping); a timestamp ``t`` is due for a period ``P`` when ``e = (now - t) mod 2**32``
has ``e < 2**31`` (else ``t`` is in the future: "not yet") and ``e >= P``. alpha is a 20-bit
fraction (1.0 = 2**20, saturates at 2**20 - 1); FlowMatrix W is Q0.16, the congestion signal Q
is Q8.8. Parameters (``rp_params_layout()``, names and widths in ``stellar.hdl.cc.params``)
follow the ConnectX names.

Per-QP state (``rp_state_layout()``, all zero at configuration = mode NONE): mode, active, rc,
rt, alpha, t_alpha, t_rate, byte_cnt, it, ib (DCQCN) and w, cnps, infl_prev, infl_last, t_fm
(FlowMatrix). Each event acts on one QP at the ``now_us`` sampled when it was issued:

INIT(qp, mode): rc = rt = max_rate; alpha = initial_alpha << 10; active = it = ib = byte_cnt = 0;
  t_alpha = t_rate = t_fm = now; w = sigma0 (``sigmoid.sigma0(fm_c)``); cnps = infl_prev =
  infl_last = 0; mode stored. Emits rc. (Mode 3 is stored and behaves like NONE.)

DCQCN (mode 1):
- CNP: a10 = alpha >> 10; dec = (rc * a10) >> gd; floor = (rc * min_dec_fac * 1311) >> 17;
  rt = rc; rc = min(max(rc - dec, floor, min_rate), 2**20 - 1) (rc - dec may be negative when
  gd < 10: it then loses to the other terms; the cap matters only for min_dec_fac > 100);
  alpha = min(alpha + ((2**20 - alpha) >> g_shift), 2**20 - 1); t_alpha = t_rate = now;
  byte_cnt = it = ib = 0; active = 1. Emits rc. Taken whether active or not.
- SENT(bytes) while active: byte_cnt += bytes; if byte_cnt >= byte_reset: byte_cnt -=
  byte_reset (once per event), ib += 1 (saturating at 255), increase(). byte_cnt saturates at
  2**24 - 1 (it can only grow past byte_reset when packets are larger than byte_reset).
- TIMER while active: if t_alpha is due for alpha_period: alpha -= alpha >> g_shift, t_alpha =
  now. If t_rate is due for time_reset: it += 1 (saturating), t_rate = now, increase().
- increase(): with hi = max(it, ib), lo = min(it, ib), F = threshold: hi < F: fast recovery
  (rt unchanged); lo >= F: hyper, rt += hai_rate * (lo - F + 1); else additive, rt += ai_rate.
  Then rt = min(rt, max_rate); rc = (rt + rc + 1) >> 1; active = 0 if rc == max_rate (the QP is
  no longer limited and its timers stop). Emits rc, changed or not. The average rounds half up:
  with the floor, rc = max_rate - 1 would average with rt = max_rate back to max_rate - 1 for
  ever, so a QP could never recover fully nor go inactive.
- An inactive QP ignores SENT and TIMER; NONE ignores everything but INIT.

FlowMatrix (mode 2, EXPERIMENTAL: a smoothed sigmoid of a congestion signal sets the rate;
seed design W' = a W + (1 - a) sigmoid(b Q + c)):
- SENT(inflight): infl_last = inflight (the QP's packets in flight, in PSNs).
- CNP: cnps += 1 (saturating), then update() at once (no period wait): a CNP acts immediately.
- TIMER: if t_fm is due for fm_period: update(periodic), which also starts the next period:
  cnps = 0, infl_prev = infl_last, t_fm = now.
- update(): trend = infl_last - infl_prev if positive as a signed 16-bit value, else 0 (the
  "early warning": in-flight PSNs grow when queues in the network build up and lengthen the
  RTT, before any switch marks ECN); Q = min(fm_cnp_gain * cnps + fm_trend_gain * trend, 65535);
  x = ((fm_b * Q) >> 8) + fm_c (signed Q8.8); s = SIGMOID[clamp((x >> 4) + 128, 0, 255)];
  W = (fm_a * W + (65536 - fm_a) * s) >> 16; rc = max(min((max_rate * (65536 - W) * fm_norm)
  >> 32, max_rate), min_rate). Emits rc. With no signal W decays to sigma0 and rc returns to
  max_rate (fm_norm = ``sigmoid.fm_norm(fm_c)``).
- Refinement of the seed design: a CNP's immediate update neither clears cnps nor moves
  infl_prev; only the periodic update closes a period. So the k-th CNP of a period acts with
  Q = k * fm_cnp_gain (+ the trend so far): CNP density, not just CNP presence, drives W, and the
  period's update sees every CNP of the period. (Clearing cnps on every CNP, as first drafted,
  would have left cnps always 0 between events.)

Timing of the machine (clocks; ``I`` = the issue cycle of an event):
- I: the arbiter picks the highest-priority event and presents its QP to the RAM.
- I+1 (S1): the RAM word is registered (block-RAM output to a flip-flop, nothing else); the
  due windows of the event's ``now`` and bytes - byte_reset are computed from the event alone.
- I+2 (S2): the word, replaced by the last result when that was the same QP's (the result of
  the previous event may reach the RAM after this event's read; the choice is registered in
  S1), is decoded; due tests (two compares against the windows), byte counter, stages and the
  operands of the increase step, the sums of increase() (rt + rc + 1, max_rate + rc + 1);
  I+3 (S3): increase step (an 18 x 9 product; the rate's top 2 bits times the factor, or
  ai_rate, go into the sums), the CNP products, alpha shifted, the byte counter's and stages' choices; I+4
  (S4): new rates (one addition and a choice each), new alpha; the new state is registered;
  at I+5 the RAM is written from that register and ``rate`` and ``trace`` pulse. A CNP of a
  DCQCN QP sums its products in S4, computes max(rc - dec, 0) and max(floor, min_rate) in S5
  and its state in S6 (I+6).
- So events issue every 3 clocks (I+3 is the next issue: its S2 at I+5 takes the new state
  from the result register), every 5 after a CNP of a DCQCN QP (the next S2 at I+7 sees the
  result of I+6); whether an event is one of the longer kinds is known in S3, which holds the
  issue of I+3 back. A FlowMatrix update (CNP of a mode-2 QP, or its TIMER with the period
  due) continues through F5..F13 (fm_b * Q; table index; table word registered; (1 - a) * s;
  W and 65536 - W; K * (65536 - W) with K = max_rate * fm_norm, as three registered 18 x 17
  products; their sum; clamp at I+12, registered; the new state at I+13, RAM write and
  ``rate`` at I+14): it occupies the machine for 12 clocks instead of 3.
- ``rate`` comes 5 clocks after the issue (7 for a CNP of a DCQCN QP, 14 for a FlowMatrix
  update).
- Every multiplier output is registered; the widest, K * (65536 - W), is 52 x 17 bits, split
  in three products summed in the next stage.
- Parameters pass one register stage (two for the derived ones: min_dec_fac * 1311, max_rate
  + 1, 2 max_rate, fm_c + 2048; three for K = max_rate * fm_norm and sigma0): a CSR change
  applies to events issued 3 or more clocks later. Change them while no QP depends on the old
  values (the driver writes them before setting QPs up).
- ECP5 at 125 MHz (``python -m stellar.sim.timing rp``) set this structure: nothing but a
  flip-flop behind a block-RAM output (its clock-to-out is ~5.6 ns) and nothing but a register
  before its inputs, at most one carry chain and a choice, or one multiplier (18 x 18), per
  stage.

Input FIFOs and the spacing that keeps them from overflowing (an event that finds its FIFO full is
lost and pulses ``lost``): ``sent`` holds 8 and never overflows when sent events come at most once
per 4 clocks and the init and cnp events of any window of T clocks need at most T/4 + 12 clocks of
the machine (3 for an INIT, 5 for a CNP of a DCQCN QP, 12 for a CNP of a FlowMatrix QP) -- e.g.
DCQCN CNPs at one per 20 clocks with bursts of two, or FlowMatrix CNPs at one per 48. (Timer
events are issued only when all three FIFOs are empty, so at most one, of at most 12 clocks,
delays a backlog.) ``cnp`` holds 8: DCQCN CNPs at most one per 9 clocks on average (bursts of 7),
FlowMatrix CNPs at most one per 12; ``init`` holds 4 (host writes, tens of clocks apart).

Timer scanner: reads one QP per clock through a second RAM read port, round robin (the word is
registered, then tested against the due windows of the ``now_us`` of the clock before, and the
test registered: a QP's test result is 3 clocks behind its read), and raises TIMER for a QP of
mode DCQCN that is active with t_alpha or t_rate due, or of mode FlowMatrix with t_fm due. One
request waits in a slot for the machine; while the slot is full the scanner re-reads the QP it
found due (so no QP is skipped). Its view may be 3 clocks stale (and a word read in the clock its
QP is written is undefined on hardware): the machine re-checks every condition, and a TIMER with
nothing due only appears in the trace.

Ports (``IB`` = log2(qps); every stream is always ready; ``qps`` a power of two >= 2):
  ``init``      In   ``{qp: IB, mode: 2}``: the host set up (or re-set) the QP, mode RpMode.
  ``cnp``       In   ``{qp: IB}``: a CNP for the QP arrived.
  ``sent``      In   ``{qp: IB, bytes: 16, inflight: 16}``: a request packet of the QP left
                     (bytes charged on the wire; inflight = its PSNs not yet acknowledged).
  ``now_us``    In   32: microseconds since reset (wrapping).
  ``params``    In   ``rp_params_layout()``.
  ``rate``      Out  ``{qp: IB, rate: 20}``: every rate the QP gets, in event order.
  ``trace``     Out  ``rp_trace_layout(IB)`` ``{kind, qp, mode, bytes, inflight, now}``: one
                     entry per event processed, in order, with the ``now`` it used and the QP's
                     mode (INIT: the new one); for tests (unconnected in the NIC).
  ``dbg_addr``  In   IB; ``dbg_data`` Out ``rp_state_layout()``: the state of QP ``dbg_addr``
                     one clock after it is set (a third RAM read port, independent of the
                     machine; the word may be a clock behind a write, and is undefined on
                     hardware when read in the clock its QP is written).
  ``lost``      Out  1: an event found its FIFO full this clock (and was dropped).

Memory: the state RAM is ``qps`` x 255 bits with three read ports (machine, scanner, dbg) and
one write port (yosys replicates it once per read port); the sigmoid ROM is 256 x 16 with two
read ports (update, sigma0).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from . import params as P
from .sigmoid import SIGMOID_ENTRIES, sigmoid_table

__all__ = ["RpMode", "RpEvent", "ReactionPoint", "rp_params_layout", "rp_state_layout",
           "rp_trace_layout", "RATE_BITS", "RP_DEFAULTS"]

RATE_BITS = P.RATE_BITS
RP_DEFAULTS = P.RP_DEFAULTS
_RATE_MAX = (1 << RATE_BITS) - 1


class RpMode(enum.Enum, shape=2):
    NONE = P.MODE_NONE
    DCQCN = P.MODE_DCQCN
    FLOWMATRIX = P.MODE_FLOWMATRIX


class RpEvent(enum.Enum, shape=2):
    INIT = P.EV_INIT
    CNP = P.EV_CNP
    SENT = P.EV_SENT
    TIMER = P.EV_TIMER


def rp_params_layout():
    """The reaction point's parameters (``params`` port), from ``params.RP_PARAM_FIELDS``."""
    return data.StructLayout({name: (signed(w) if s else unsigned(w))
                              for name, w, s in P.RP_PARAM_FIELDS})


def rp_state_layout():
    """One QP's state word, from ``params.RP_STATE_FIELDS`` (255 bits)."""
    return data.StructLayout({name: unsigned(w) for name, w in P.RP_STATE_FIELDS})


def rp_trace_layout(index_bits):
    """An event as processed: kind, QP, mode, the SENT fields and the ``now_us`` it used."""
    return data.StructLayout({"kind": RpEvent, "qp": index_bits, "mode": 2, "bytes": 16,
                              "inflight": 16, "now": 32})


def _in_window(t, window):
    """``t`` due: ``(now - t) mod 2**32`` in [period, 2**31) (>= 2**31 elapsed means "not yet"),
    tested as ``t`` in the window (lo, hi] of ``ReactionPoint._window``: two compares side by
    side instead of a subtraction followed by a compare."""
    lo, hi, wrap = window
    above, below = t > lo, t <= hi
    return Mux(wrap, above | below, above & below)


def _inc_sat8(v):
    return Mux(v == 255, 255, v + 1)[:8]


class ReactionPoint(wiring.Component):
    """Per-QP DCQCN / FlowMatrix reaction point (see the module docstring)."""

    FIFO_INIT = 4
    FIFO_CNP = 8
    FIFO_SENT = 8
    PERIOD = 3          # clocks per event
    PERIOD_CNP = 5      # clocks per CNP of a DCQCN QP
    PERIOD_FM = 12      # clocks per FlowMatrix update

    def __init__(self, qps=256):
        assert qps >= 2 and qps & (qps - 1) == 0, "qps must be a power of two >= 2"
        self.qps = qps
        self.index_bits = ib = (qps - 1).bit_length()
        super().__init__({
            "init":     In(stream.Signature(data.StructLayout({"qp": ib, "mode": RpMode}),
                                            always_ready=True)),
            "cnp":      In(stream.Signature(data.StructLayout({"qp": ib}), always_ready=True)),
            "sent":     In(stream.Signature(data.StructLayout({"qp": ib, "bytes": 16,
                                                               "inflight": 16}),
                                            always_ready=True)),
            "now_us":   In(32),
            "params":   In(rp_params_layout()),
            "rate":     Out(stream.Signature(data.StructLayout({"qp": ib, "rate": RATE_BITS}),
                                             always_ready=True)),
            "trace":    Out(stream.Signature(rp_trace_layout(ib), always_ready=True)),
            "dbg_addr": In(ib),
            "dbg_data": Out(rp_state_layout()),
            "lost":     Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        ib = self.index_bits
        st_layout = rp_state_layout()
        ev_layout = rp_trace_layout(ib)

        # ------------------------------------------------------------ parameters
        # One register stage between the CSRs and the arithmetic (timing), plus the products
        # that depend on parameters only, computed once here instead of per event.
        p = Signal(rp_params_layout())
        m.d.sync += p.eq(self.params)
        mdf1311 = Signal(18)                  # min_dec_fac * 1311 (percent -> 1/2**17)
        k_parts = [Signal(18 + 16, name=f"k_part{i}") for i in range(4)]
        k = Signal(RATE_BITS + 32)            # max_rate * fm_norm
        one_minus_a = Signal(17)              # 65536 - fm_a
        mr1 = Signal(RATE_BITS + 1)           # max_rate + 1
        mr2 = Signal(RATE_BITS + 1)           # 2 * max_rate
        min_over_max = Signal()               # min_rate > max_rate
        fm_c_idx = Signal(signed(17))         # fm_c + 2048: (x >> 4) + 128 == (x - fm_c + this) >> 4
        m.d.sync += [
            mdf1311.eq(p.min_dec_fac * 1311),
            # max_rate * fm_norm as four registered 18 x 16 products (one multiplier each)
            k_parts[0].eq(p.max_rate[:18] * p.fm_norm[:16]),
            k_parts[1].eq(p.max_rate[:18] * p.fm_norm[16:]),
            k_parts[2].eq(p.max_rate[18:] * p.fm_norm[:16]),
            k_parts[3].eq(p.max_rate[18:] * p.fm_norm[16:]),
            k.eq(k_parts[0] + (k_parts[1] << 16) + (k_parts[2] << 18) + (k_parts[3] << 34)),
            one_minus_a.eq(65536 - p.fm_a),
            mr1.eq(p.max_rate + 1),
            mr2.eq(p.max_rate << 1),
            min_over_max.eq(p.min_rate > p.max_rate),
            fm_c_idx.eq(p.fm_c + (SIGMOID_ENTRIES // 2 << 4)),
        ]

        m.submodules.rom = rom = Memory(shape=16, depth=SIGMOID_ENTRIES, init=sigmoid_table())
        rom_upd = rom.read_port()
        rom_s0 = rom.read_port()
        sigma0 = rom_s0.data                  # table value at argument fm_c (Q = 0)
        m.d.comb += rom_s0.addr.eq(self._sig_index(m, Const(0, 1), fm_c_idx, "s0"))

        # ------------------------------------------------------------ state RAM
        m.submodules.mem = mem = Memory(shape=st_layout, depth=self.qps, init=[],
                                        attrs={"no_rw_check": 1})
        # Asynchronous read ports, each followed by a flip-flop (``*_word``) that Yosys merges
        # into the block RAM as its read register: a synchronous read, as ``read_port()`` would
        # give, but one that ``no_rw_check`` applies to. A read that meets a write of the same
        # word at the same edge may then return anything (the machine never uses such a word:
        # see the forwarding in S1; the scanner and ``dbg`` may see one), and Yosys adds no
        # read-first emulation (a delayed write and a bypass multiplexer behind each RAM output,
        # on the critical paths).
        wr = mem.write_port()
        rd = mem.read_port(domain="comb")
        sc_rd = mem.read_port(domain="comb")
        dbg_rd = mem.read_port(domain="comb")
        rd_word = Signal(st_layout, reset_less=True)
        sc_word = Signal(st_layout, reset_less=True)
        dbg_word = Signal(st_layout, reset_less=True)
        m.d.sync += [rd_word.eq(rd.data), sc_word.eq(sc_rd.data), dbg_word.eq(dbg_rd.data)]
        m.d.comb += [dbg_rd.addr.eq(self.dbg_addr), self.dbg_data.eq(dbg_word)]

        # The last result, registered (``lw``): the RAM write port takes it from these registers,
        # a clock later (no logic between the stages and the block RAM's inputs), and an event
        # that read its QP before that write landed takes it from here (S1, S2).
        res_en = Signal()                    # a result is computed this clock (S4, S5 or F12)
        res_qp = Signal(ib)
        res_data = Signal(st_layout)
        lw_valid = Signal()
        lw_we = Signal()
        lw_qp = Signal(ib)
        lw_data = Signal(st_layout)
        m.d.sync += [lw_valid.eq(lw_valid | res_en), lw_we.eq(res_en)]
        with m.If(res_en):
            m.d.sync += [lw_qp.eq(res_qp), lw_data.eq(res_data)]
        m.d.comb += [wr.en.eq(lw_we), wr.addr.eq(lw_qp), wr.data.eq(lw_data)]

        # ------------------------------------------------------------ input FIFOs
        m.submodules.f_init = f_init = fifo.SyncFIFO(width=ib + 2, depth=self.FIFO_INIT)
        m.submodules.f_cnp = f_cnp = fifo.SyncFIFO(width=ib, depth=self.FIFO_CNP)
        m.submodules.f_sent = f_sent = fifo.SyncFIFO(width=ib + 32, depth=self.FIFO_SENT)
        for f, s in ((f_init, self.init), (f_cnp, self.cnp), (f_sent, self.sent)):
            m.d.comb += [f.w_en.eq(s.valid), f.w_data.eq(s.payload)]
        m.d.comb += self.lost.eq((self.init.valid & ~f_init.w_rdy) | (self.cnp.valid & ~f_cnp.w_rdy)
                                 | (self.sent.valid & ~f_sent.w_rdy))
        h_init = data.StructLayout({"qp": ib, "mode": 2})(f_init.r_data)
        h_cnp = data.StructLayout({"qp": ib})(f_cnp.r_data)
        h_sent = data.StructLayout({"qp": ib, "bytes": 16, "inflight": 16})(f_sent.r_data)

        # ------------------------------------------------------------ timer scanner
        # Two stages, so that no arithmetic hangs off the block-RAM output: the word of QP q1 is
        # on sc_rd.data, the word of QP q2 (registered) is tested for due timers.
        sc_addr = Signal(ib)                  # QP read at this clock's edge
        q1 = Signal(ib)
        v1 = Signal()
        q2 = Signal(ib)
        v2 = Signal()
        w2 = Signal(data.StructLayout({"mode": 2, "active": 1, "t_alpha": 32, "t_rate": 32,
                                       "t_fm": 32}), reset_less=True)
        # The due windows at the now_us of the clock before (the scanner's view may be stale).
        sc_win = {name: self._window(m, self.now_us, getattr(p, name), f"sc_{name}")
                  for name in ("alpha_period", "time_reset", "fm_period")}
        t_valid = Signal()                    # the TIMER request slot
        t_qp = Signal(ib)
        t_take = Signal()                     # the machine issues the slot's TIMER this clock
        q3 = Signal(ib)
        found = Signal()                      # QP q3 has a timer due (registered test of w2)
        m.d.comb += sc_rd.addr.eq(sc_addr)
        m.d.sync += [
            found.eq(v2 & (
                ((w2.mode == P.MODE_DCQCN) & w2.active
                 & (_in_window(w2.t_alpha, sc_win["alpha_period"])
                    | _in_window(w2.t_rate, sc_win["time_reset"])))
                | ((w2.mode == P.MODE_FLOWMATRIX) & _in_window(w2.t_fm, sc_win["fm_period"])))),
            q3.eq(q2),
        ]
        with m.If(t_take):
            m.d.sync += t_valid.eq(0)
        with m.If(found & t_valid & ~t_take):
            # Slot busy: read q3 again (the words behind it are dropped and read again too).
            m.d.sync += [sc_addr.eq(q3), v1.eq(0), v2.eq(0), found.eq(0)]
        with m.Else():
            m.d.sync += [
                sc_addr.eq(sc_addr + 1), q1.eq(sc_addr), v1.eq(1), q2.eq(q1), v2.eq(v1),
                w2.mode.eq(sc_word.mode), w2.active.eq(sc_word.active),
                w2.t_alpha.eq(sc_word.t_alpha), w2.t_rate.eq(sc_word.t_rate),
                w2.t_fm.eq(sc_word.t_fm),
            ]
            with m.If(found):
                m.d.sync += [t_valid.eq(1), t_qp.eq(q3)]

        # ------------------------------------------------------------ issue
        cool = Signal(range(self.PERIOD_FM))  # clocks until the next issue is allowed
        long3 = Signal()                      # S3: this event holds the machine longer
        long3_fm = Signal()                   # ... 12 clocks in all (else 5)
        can = (cool == 0) & ~long3
        pick_init = Signal()
        pick_cnp = Signal()
        pick_sent = Signal()
        issue = Signal()
        ev_i = Signal(ev_layout)
        m.d.comb += [
            pick_init.eq(can & f_init.r_rdy),
            pick_cnp.eq(can & ~f_init.r_rdy & f_cnp.r_rdy),
            pick_sent.eq(can & ~f_init.r_rdy & ~f_cnp.r_rdy & f_sent.r_rdy),
            t_take.eq(can & ~f_init.r_rdy & ~f_cnp.r_rdy & ~f_sent.r_rdy & t_valid),
            issue.eq(pick_init | pick_cnp | pick_sent | t_take),
            f_init.r_en.eq(pick_init), f_cnp.r_en.eq(pick_cnp), f_sent.r_en.eq(pick_sent),
            ev_i.now.eq(self.now_us),
        ]
        # The event in priority order, whether the machine can take it or not (``issue`` says
        # whether it does): the RAM address then does not wait for the cool-down logic.
        with m.If(f_init.r_rdy):
            m.d.comb += [ev_i.kind.eq(RpEvent.INIT), ev_i.qp.eq(h_init.qp), ev_i.mode.eq(h_init.mode)]
        with m.Elif(f_cnp.r_rdy):
            m.d.comb += [ev_i.kind.eq(RpEvent.CNP), ev_i.qp.eq(h_cnp.qp)]
        with m.Elif(f_sent.r_rdy):
            m.d.comb += [ev_i.kind.eq(RpEvent.SENT), ev_i.qp.eq(h_sent.qp),
                         ev_i.bytes.eq(h_sent.bytes), ev_i.inflight.eq(h_sent.inflight)]
        with m.Else():
            m.d.comb += [ev_i.kind.eq(RpEvent.TIMER), ev_i.qp.eq(t_qp)]
        m.d.comb += rd.addr.eq(ev_i.qp)

        with m.If(issue):
            m.d.sync += cool.eq(self.PERIOD - 1)
        with m.Elif(long3):
            m.d.sync += cool.eq(Mux(long3_fm, self.PERIOD_FM - 4, self.PERIOD_CNP - 4))
        with m.Elif(cool != 0):
            m.d.sync += cool.eq(cool - 1)

        # ------------------------------------------------------------ S1: RAM word registered
        s1_valid = Signal()
        s1_ev = Signal(ev_layout)
        s2_valid = Signal()
        s2_ev = Signal(ev_layout)
        s2_mem = Signal(st_layout, reset_less=True)
        m.d.sync += [s1_valid.eq(issue), s2_valid.eq(s1_valid), s2_mem.eq(rd_word)]
        with m.If(issue):
            m.d.sync += s1_ev.eq(ev_i)
        with m.If(s1_valid):
            m.d.sync += s2_ev.eq(s1_ev)
        # Which word S2 uses, decided here so that S2 starts from flip-flops only: the last
        # result as it will stand at S2 (one computed at this edge, else the one before) if it
        # is this event's QP's, else the RAM word. (The last result of a QP is its newest state,
        # whether its RAM write has landed or not.)
        # Four copies of the choice, each driving a quarter of the multiplexers (one net to ~500
        # loads is ~2 ns of routing). They differ off the valid events only, so Yosys keeps
        # them apart: S2 uses them only when s1_valid was high.
        fwd_raw = Mux(res_en, res_qp == s1_ev.qp, lw_valid & (lw_qp == s1_ev.qp))
        fwd = Signal()                       # the copy of the whole word into ``old``
        fwd_t = Signal()                     # timestamps (due tests)
        fwd_s = Signal()                     # mode, active, stages, byte counter
        fwd_r = Signal()                     # rates, alpha, FlowMatrix fields
        m.d.sync += [fwd.eq(fwd_raw), fwd_t.eq(fwd_raw & s1_valid),
                     fwd_s.eq(fwd_raw | ~s1_valid), fwd_r.eq(fwd_raw & (s1_valid | lw_valid))]
        # What S2 needs from the event alone: the due windows at the event's now, and the byte
        # counter's crossing offset (bytes - byte_reset).
        win = {name: self._window(m, s1_ev.now, getattr(p, name), name)
               for name in ("alpha_period", "time_reset", "fm_period")}
        nb = Signal(signed(26))
        m.d.sync += nb.eq(s1_ev.bytes - p.byte_reset)
        # The stage thresholds as this event's kind moves them (a TIMER's increase follows
        # it += 1, a SENT's ib += 1): it_s >= F iff it >= F - [TIMER] (255 saturates, and
        # passes both), and it_s + 1 - F = it + (1 - F + [TIMER]) unless it_s saturates: then
        # it + c_it = 257 - F exceeds the other stage's term (at most 256 - F, as that stage
        # does not move), which the minimum picks, so the saturation needs no case of its own.
        s1_tmr = s1_ev.kind == RpEvent.TIMER
        s1_sent = s1_ev.kind == RpEvent.SENT
        thr_it = Signal(signed(6))
        thr_ib = Signal(signed(6))
        c_it = Signal(signed(6))
        c_ib = Signal(signed(6))
        m.d.sync += [thr_it.eq(p.threshold - s1_tmr), thr_ib.eq(p.threshold - s1_sent),
                     c_it.eq(1 - p.threshold + s1_tmr), c_ib.eq(1 - p.threshold + s1_sent)]

        # ------------------------------------------------------------ S2: decode
        st = Signal(st_layout)               # the word as S2's logic sees it
        for name, sel in (("t_alpha", fwd_t), ("t_rate", fwd_t), ("t_fm", fwd_t),
                          ("mode", fwd_s), ("active", fwd_s), ("it", fwd_s), ("ib", fwd_s),
                          ("byte_cnt", fwd_s)):
            m.d.comb += st[name].eq(Mux(sel, lw_data[name], s2_mem[name]))
        for name, _w in P.RP_STATE_FIELDS:
            if name not in ("t_alpha", "t_rate", "t_fm", "mode", "active", "it", "ib",
                            "byte_cnt"):
                m.d.comb += st[name].eq(Mux(fwd_r, lw_data[name], s2_mem[name]))
        e = s2_ev
        k_init = e.kind == RpEvent.INIT
        k_cnp = e.kind == RpEvent.CNP
        k_sent = e.kind == RpEvent.SENT
        k_tmr = e.kind == RpEvent.TIMER
        dcq = ~k_init & (st.mode == P.MODE_DCQCN)
        fmq = ~k_init & (st.mode == P.MODE_FLOWMATRIX)

        # Work registers: one event at a time is past S1, so S2 loads them and S3..F12 use them.
        ev = Signal(ev_layout)               # the event (mode: the new one for INIT, else the QP's)
        old = Signal(st_layout)              # its state as read
        is_init = Signal()
        cnp_d = Signal()                     # DCQCN CNP
        sent_d = Signal()                    # DCQCN SENT while active
        tmr_d = Signal()                     # DCQCN TIMER while active
        sent_f = Signal()                    # FlowMatrix SENT
        fm_upd = Signal()                    # FlowMatrix update
        fm_per = Signal()                    # ... periodic (TIMER, period due)
        due_a = Signal()
        due_r = Signal()
        cross2 = Signal()                    # byte_cnt + bytes >= byte_reset
        bc2 = Signal(25)                     # byte_cnt + bytes, less byte_reset if crossed
        it2 = Signal(8)                      # it, ib as increase() would see them
        ib2 = Signal(8)
        # The step of increase(), hai_rate * factor (hyper), ai_rate (additive) or 0 (fast):
        # inc = m_a * m_f + ((m_h * m_f) << 18) + m_ai, with (m_a, m_h) = hai_rate's low 18 and
        # top 2 bits when hyper, else 0, and m_ai = ai_rate when additive, else 0; the factor
        # goes to the product unselected (one 18 x 9 multiplier, the 2 x 9 one in logic).
        m_a = Signal(18)
        m_h = Signal(RATE_BITS - 18)
        m_f = Signal(9)
        m_ai = Signal(RATE_BITS)
        cnps_new = Signal(8)
        trend = Signal(16)
        nalpha = Signal(P.ALPHA_BITS + 1)    # 2**20 - alpha
        # increase(), rearranged so that S4 is one addition and a choice: with rt' = rt + inc,
        # min(rt', max_rate) + rc + 1 = min(x1 + inc, y1), and rt' > max_rate iff inc > dmr.
        x1 = Signal(RATE_BITS + 1)           # rt + rc + 1
        y1 = Signal(RATE_BITS + 1)           # max_rate + rc + 1
        dmr = Signal(signed(RATE_BITS + 1))  # max_rate - rt

        # DCQCN byte counter (only used when sent_d): byte_cnt + bytes, less byte_reset if that
        # is not negative; both sums at once.
        sum_b = Signal(25)
        dif_b = Signal(signed(26))
        bc = Signal(25)
        cross = ~dif_b[-1]
        m.d.comb += [
            sum_b.eq(st.byte_cnt + e.bytes),
            dif_b.eq(st.byte_cnt + nb),
            bc.eq(Mux(cross, dif_b[:25], sum_b)),
        ]
        # Stages as increase() sees them: a TIMER's increase always follows it += 1, a SENT's
        # ib += 1, so the class can be decided without waiting for the due / cross tests.
        # (hi < F iff both are; lo >= F iff both are.)
        it_s = Signal(8)
        ib_s = Signal(8)
        m.d.comb += [
            it_s.eq(Mux(k_tmr, _inc_sat8(st.it), st.it)),
            ib_s.eq(Mux(k_sent, _inc_sat8(st.ib), st.ib)),
        ]
        # hi < F iff both are; lo >= F iff both are; factor = lo - F + 1 when hyper (1..256)
        # The stage compares on both candidate words, chosen after (``fwd_s`` drives a choice
        # of two compare results instead of the compares' operands: ECPIX-5 timing).
        up_it = Mux(fwd_s, lw_data.it >= thr_it, s2_mem.it >= thr_it)
        up_ib = Mux(fwd_s, lw_data.ib >= thr_ib, s2_mem.ib >= thr_ib)
        cls_fast = ~up_it & ~up_ib
        cls_hyper = up_it & up_ib
        a_it = st.it + c_it
        a_ib = st.ib + c_ib
        factor = Mux(a_it < a_ib, a_it, a_ib)[:9]
        s_due_a = _in_window(st.t_alpha, win["alpha_period"])
        s_due_r = _in_window(st.t_rate, win["time_reset"])
        # FlowMatrix due test on both candidate words, then the choice (as for the stages)
        s_due_f = Mux(fwd_t, _in_window(lw_data.t_fm, win["fm_period"]),
                      _in_window(s2_mem.t_fm, win["fm_period"]))
        d_infl = (st.infl_last - st.infl_prev)[:16]
        s_sent_d = k_sent & dcq & st.active
        s_tmr_d = k_tmr & dcq & st.active
        s_fm_upd = fmq & (k_cnp | (k_tmr & s_due_f))

        with m.If(s2_valid):
            m.d.sync += [
                ev.eq(e),
                ev.mode.eq(Mux(k_init, e.mode, st.mode)),
                old.eq(Mux(fwd, lw_data, s2_mem)),
                is_init.eq(k_init),
                cnp_d.eq(k_cnp & dcq),
                sent_d.eq(s_sent_d),
                tmr_d.eq(s_tmr_d),
                sent_f.eq(k_sent & fmq),
                fm_upd.eq(s_fm_upd),
                fm_per.eq(fmq & k_tmr & s_due_f),
                due_a.eq(s_due_a),
                due_r.eq(s_due_r),
                cross2.eq(cross),
                bc2.eq(bc),
                it2.eq(it_s),
                ib2.eq(ib_s),
                m_a.eq(Mux(cls_hyper, p.hai_rate[:18], 0)),
                m_h.eq(Mux(cls_hyper, p.hai_rate[18:], 0)),
                m_f.eq(factor),
                m_ai.eq(Mux(cls_hyper | cls_fast, 0, p.ai_rate)),
                cnps_new.eq(Mux(k_cnp & fmq, _inc_sat8(st.cnps), st.cnps)),
                trend.eq(Mux(d_infl[15], 0, d_infl)),
                nalpha.eq((1 << P.ALPHA_BITS) - st.alpha),
                # rt + rc + 1 in one subtraction: (rt + 2**20) - (2**20 - 1 - rc)
                x1.eq(Cat(st.rt, Const(1, 1)) - ~st.rc),
                y1.eq(st.rc + mr1),
                dmr.eq(p.max_rate - st.rt),
            ]

        # ------------------------------------------------------------ S3
        ph3 = Signal()
        ph4 = Signal()
        ph5 = Signal()                       # S5, S6 of a DCQCN CNP only (ph4 delayed would
        ph6 = Signal()                       # put the previous event's S6 in this one's S3)
        m.d.sync += [ph3.eq(s2_valid), ph4.eq(ph3), ph5.eq(ph4 & cnp_d), ph6.eq(ph5)]
        m.d.comb += [long3.eq(ph3 & (fm_upd | cnp_d)), long3_fm.eq(fm_upd)]
        fire = Signal()                      # DCQCN increase()
        bc_new = Signal(24)
        it_new = Signal(8)
        ib_new = Signal(8)
        with m.If(ph3):
            m.d.sync += [
                fire.eq((sent_d & cross2) | (tmr_d & due_r)),
                bc_new.eq(Mux(bc2[24], (1 << 24) - 1, bc2[:24])),
                it_new.eq(Mux(tmr_d & due_r, it2, old.it)),
                ib_new.eq(Mux(sent_d & cross2, ib2, old.ib)),
            ]
        inc_lo = Signal(27)                  # m_a * m_f
        # Two more copies of it (loaded under other enables, so that Yosys keeps them apart;
        # all three hold m_a * m_f in S4): each of the five carry chains of S4 is fed by one
        # copy of at most two chains (one flip-flop to five chains was a 4 ns net, ECPIX-5).
        inc_lo_b = Signal(27)                # every clock (m_a, m_f hold from S2 to S4)
        inc_lo_c = Signal(27)                # every clock but S4
        rt3 = Signal(RATE_BITS + 12)         # rt + hbx, and the other sums of increase()
        x13 = Signal(RATE_BITS + 12)         # with hbx already in
        # rc_inc == max_rate (not capped) iff x1 + hbx + inc_lo - 2 max_rate is 0 or 1, i.e.
        # inc_lo in [zn3, zn3 + 1] with zn3 = 2 max_rate - x1 - hbx: two compares of inc_lo
        # against registered bounds (carry outs only), instead of a sum and a 33-bit zero test.
        zn3 = Signal(signed(RATE_BITS + 13))   # 2 max_rate - x1 - hbx
        zn3p2 = Signal(signed(RATE_BITS + 13))  # zn3 + 2
        dmr3 = Signal(signed(RATE_BITS + 13))  # max_rate - rt - hbx
        y_not_max = Signal()                 # y1 >> 1 != max_rate
        # CNP: rc * (alpha >> 10) and rc * min_dec_fac * 1311, each as the products of rc's low
        # 18 bits and of its top 2 bits (summed in S4)
        pd_lo = Signal(18 + 10)
        pd_hi = Signal(RATE_BITS - 18 + 10)
        pf_lo = Signal(18 + 18)
        pf_hi = Signal(RATE_BITS - 18 + 18)
        nsh = Signal(P.ALPHA_BITS + 1)       # (2**20 - alpha) >> g_shift
        ash = Signal(P.ALPHA_BITS)           # alpha >> g_shift
        qa = Signal(24)
        qb = Signal(32)
        pa = Signal(32)
        hbv = Signal(RATE_BITS - 18 + 9)     # m_h * m_f (weight 2**18)
        hbx = Signal(RATE_BITS + 9)          # inc - m_a * m_f: (m_h * m_f) << 18, or m_ai
        m.d.sync += inc_lo_b.eq(m_a * m_f)
        with m.If(~ph4):
            m.d.sync += inc_lo_c.eq(m_a * m_f)
        m.d.comb += [hbv.eq(Mux(m_h[0], m_f, 0) + Mux(m_h[1], m_f << 1, 0)),
                     hbx.eq(Cat(Const(0, 18), hbv) | m_ai)]   # one of the two is 0
        with m.If(ph3):
            m.d.sync += [
                inc_lo.eq(m_a * m_f),
                rt3.eq(old.rt + hbx),
                x13.eq(x1 + hbx),
                zn3.eq(mr2 - x1 - hbx),
                zn3p2.eq(mr2 + 2 - x1 - hbx),
                dmr3.eq(dmr - hbx),
                y_not_max.eq(y1[1:] != p.max_rate),
                pd_lo.eq(old.rc[:18] * old.alpha[10:]),
                pd_hi.eq(old.rc[18:] * old.alpha[10:]),
                pf_lo.eq(old.rc[:18] * mdf1311),
                pf_hi.eq(old.rc[18:] * mdf1311),
                nsh.eq(nalpha >> p.g_shift),
                ash.eq(old.alpha >> p.g_shift),
                qa.eq(p.fm_cnp_gain * cnps_new),
                qb.eq(p.fm_trend_gain * trend),
                pa.eq(p.fm_a * old.w),
            ]

        # ------------------------------------------------------------ S4: DCQCN result, write
        # (a DCQCN CNP's decrease takes S4..S6: products summed, decrease, choice)
        rt_sum = Signal(RATE_BITS + 12)
        capped = Signal()                    # rt + inc > max_rate
        avg2 = Signal(RATE_BITS + 1)         # min(rt + inc, max_rate) + rc + 1
        act_nc = Signal()                    # rc_inc != max_rate when not capped
        rt_inc = Signal(RATE_BITS)
        rc_inc = Signal(RATE_BITS)
        act_inc = Signal()                   # rc_inc != max_rate
        alpha_up = Signal(P.ALPHA_BITS + 1)
        alpha_new = Signal(P.ALPHA_BITS)     # (1 - g) alpha + g on a CNP, (1 - g) alpha when due
        m.d.comb += [
            rt_sum.eq(rt3 + inc_lo),
            capped.eq(inc_lo_c > dmr3),
            avg2.eq(Mux(capped, y1, x13 + inc_lo_b)),
            act_nc.eq((inc_lo_b < zn3) | (inc_lo >= zn3p2)),
            rt_inc.eq(Mux(capped, p.max_rate, rt_sum)),
            rc_inc.eq(avg2 >> 1),
            act_inc.eq(Mux(capped, y_not_max, act_nc)),
            alpha_up.eq(old.alpha + nsh),
            alpha_new.eq(Mux(cnp_d, Mux(alpha_up[P.ALPHA_BITS], (1 << P.ALPHA_BITS) - 1,
                                        alpha_up[:P.ALPHA_BITS]),
                             Mux(tmr_d & due_a, (old.alpha - ash)[:P.ALPHA_BITS], old.alpha))),
        ]
        prod_dec = Signal(RATE_BITS + 10)    # rc * (alpha >> 10)
        prod_floor = Signal(RATE_BITS + 18)  # rc * min_dec_fac * 1311
        alpha5 = Signal(P.ALPHA_BITS)
        with m.If(ph4):
            m.d.sync += [
                prod_dec.eq(pd_lo + (pd_hi << 18)),
                prod_floor.eq(pf_lo + (pf_hi << 18)),
                alpha5.eq(alpha_new),
            ]
        # S5, S6 (DCQCN CNP only)
        sub = Signal(RATE_BITS)              # max(rc - dec, 0)
        m1 = Signal(RATE_BITS + 1)           # max(floor, min_rate)
        dec = Signal(RATE_BITS + 10)
        flo = Signal(RATE_BITS + 1)
        m.d.comb += [dec.eq(prod_dec >> p.gd), flo.eq(prod_floor >> 17)]
        with m.If(ph5):
            m.d.sync += [
                sub.eq(Mux(old.rc >= dec, old.rc - dec, 0)),
                m1.eq(Mux(flo > p.min_rate, flo, p.min_rate)),
            ]
        rc_cnp = Signal(RATE_BITS)
        m.d.comb += rc_cnp.eq(Mux(sub > m1, sub, Mux(m1[RATE_BITS], _RATE_MAX, m1[:RATE_BITS])))
        nx = Signal(st_layout)               # the new state of a 3-clock event
        m.d.comb += nx.eq(old)
        with m.If(is_init):
            m.d.comb += [
                nx.mode.eq(ev.mode), nx.active.eq(0), nx.rc.eq(p.max_rate), nx.rt.eq(p.max_rate),
                nx.alpha.eq(p.initial_alpha << 10), nx.t_alpha.eq(ev.now), nx.t_rate.eq(ev.now),
                nx.byte_cnt.eq(0), nx.it.eq(0), nx.ib.eq(0), nx.w.eq(sigma0), nx.cnps.eq(0),
                nx.infl_prev.eq(0), nx.infl_last.eq(0), nx.t_fm.eq(ev.now),
            ]
        with m.Elif(cnp_d):
            m.d.comb += [
                nx.rt.eq(old.rc), nx.rc.eq(rc_cnp), nx.alpha.eq(alpha5),
                nx.t_alpha.eq(ev.now), nx.t_rate.eq(ev.now), nx.byte_cnt.eq(0),
                nx.it.eq(0), nx.ib.eq(0), nx.active.eq(1),
            ]
        with m.Elif(sent_d | tmr_d):
            m.d.comb += [nx.it.eq(it_new), nx.ib.eq(ib_new), nx.alpha.eq(alpha_new)]
            with m.If(sent_d):
                m.d.comb += nx.byte_cnt.eq(bc_new)
            with m.If(tmr_d & due_a):
                m.d.comb += nx.t_alpha.eq(ev.now)
            with m.If(tmr_d & due_r):
                m.d.comb += nx.t_rate.eq(ev.now)
        with m.Elif(sent_f):
            m.d.comb += nx.infl_last.eq(ev.inflight)

        # ------------------------------------------------------------ F5..F12: FlowMatrix
        f5, f6, f7, f8, f9, f10, f11, f12, f13 = (Signal(name=f"f{i}") for i in range(5, 14))
        m.d.sync += [f5.eq(ph4 & fm_upd), f6.eq(f5), f7.eq(f6), f8.eq(f7), f9.eq(f8),
                     f10.eq(f9), f11.eq(f10), f12.eq(f11), f13.eq(f12)]
        q = Signal(16)
        xb = Signal(32)
        s7 = Signal(16)
        pb = Signal(33)
        wnc = Signal(17)                     # 65536 - W'
        wn = Signal(16)                      # W'
        kp = [Signal(18 + 17, name=f"kp{i}") for i in range(3)]   # K[18i:18i+18] * (65536 - W')
        rr = Signal(RATE_BITS + 32 + 17)
        qsum = qa + qb
        with m.If(ph4):
            m.d.sync += q.eq(Mux(qsum > 65535, 65535, qsum))
        with m.If(f5):
            m.d.sync += xb.eq(p.fm_b * q)
        m.d.comb += rom_upd.addr.eq(self._sig_index(m, xb[8:], fm_c_idx, "upd"))
        with m.If(f7):                       # the table word: a flip-flop behind the block RAM
            m.d.sync += s7.eq(rom_upd.data)
        with m.If(f8):
            m.d.sync += pb.eq(one_minus_a * s7)
        wsum = (pa + pb)[16:]
        with m.If(f9):
            m.d.sync += [wn.eq(wsum), wnc.eq(65536 - wsum)]
        with m.If(f10):                      # K * (65536 - W') in three registered products
            m.d.sync += [kp[i].eq(k[18 * i:18 * i + 18] * wnc) for i in range(3)]
        with m.If(f11):
            m.d.sync += rr.eq(kp[0] + (kp[1] << 18) + (kp[2] << 36))
        v = rr[32:]
        rc_fm = Signal(RATE_BITS)
        # max(min(v, max_rate), min_rate), both compares at once
        m.d.comb += rc_fm.eq(Mux(v > p.max_rate, Mux(min_over_max, p.min_rate, p.max_rate),
                                 Mux(v < p.min_rate, p.min_rate, v)))
        # The clamp is registered (F12) before the state is made (F13): from the sum through
        # both compares and the choice of the result into ``lw_data`` it was 12.03 ns routed on
        # the ECPIX-5 core at 245eb29 (seed 1). Nothing else runs in the machine meanwhile.
        rc_fm_r = Signal(RATE_BITS)
        with m.If(f12):
            m.d.sync += rc_fm_r.eq(rc_fm)
        nf = Signal(st_layout)               # the new state of a FlowMatrix update
        m.d.comb += [
            nf.eq(old), nf.rc.eq(rc_fm_r), nf.w.eq(wn),
            nf.cnps.eq(Mux(fm_per, 0, cnps_new)),
            nf.infl_prev.eq(Mux(fm_per, old.infl_last, old.infl_prev)),
            nf.t_fm.eq(Mux(fm_per, ev.now, old.t_fm)),
        ]

        # ------------------------------------------------------------ write, rate, trace
        done3 = (ph4 & ~fm_upd & ~cnp_d) | (ph6 & cnp_d)
        m.d.comb += [
            res_qp.eq(ev.qp),
            res_en.eq(done3 | f13),
            res_data.eq(Mux(f13, nf, nx)),
        ]
        # increase(): its results (the late ones, behind S4's carry chains) chosen last, by one
        # flip-flop (``fire`` is set only with sent_d or tmr_d, so never with is_init, cnp_d or
        # a FlowMatrix update, and the choice of ``nx`` and ``nf`` before it is not needed).
        with m.If(fire):
            m.d.comb += [res_data.rt.eq(rt_inc), res_data.rc.eq(rc_inc),
                         res_data.active.eq(act_inc)]
        # ``rate`` and ``trace`` come from the result register (the clock the RAM is written),
        # so the blocks they feed start from flip-flops too.
        out_rate = Signal()
        out_ev = Signal(ev_layout)
        m.d.sync += [self.trace.valid.eq(res_en), out_rate.eq((done3 & (is_init | cnp_d | fire))
                                                               | f13)]
        with m.If(res_en):
            m.d.sync += out_ev.eq(ev)
        m.d.comb += [
            self.trace.payload.eq(out_ev),
            self.rate.valid.eq(out_rate),
            self.rate.payload.qp.eq(lw_qp),
            self.rate.payload.rate.eq(lw_data.rc),
        ]
        return m

    @staticmethod
    def _window(m, now, period, name):
        """The timestamps due for ``period`` at ``now``, registered: ``t`` is due iff it lies
        in the modular interval (lo, hi] with lo = now - 2**31, hi = now - period (``period``
        < 2**31). Returns (lo, hi, wrap) for ``_in_window``; wrap: the interval crosses 0."""
        lo = Signal(32, name=f"win_lo_{name}")
        hi = Signal(32, name=f"win_hi_{name}")
        wrap = Signal(name=f"win_wrap_{name}")
        h = (now - period)[:32]
        l_ = now ^ (1 << 31)
        m.d.sync += [lo.eq(l_), hi.eq(h), wrap.eq(h < l_)]
        return lo, hi, wrap

    @staticmethod
    def _sig_index(m, xq, c_idx, name):
        """Sigmoid table index of the signed Q8.8 ``x = xq + fm_c`` given ``c_idx = fm_c +
        2048``: clamp((x >> 4) + 128, 0, 255) = clamp((xq + c_idx) >> 4, 0, 255)."""
        xi = Signal(signed(max(len(xq), 17) - 2), name=f"sig_xi_{name}")
        idx = Signal(8, name=f"sig_idx_{name}")
        m.d.comb += [
            xi.eq((xq + c_idx) >> 4),
            idx.eq(Mux(xi < 0, 0, Mux(xi > SIGMOID_ENTRIES - 1, SIGMOID_ENTRIES - 1, xi[:8]))),
        ]
        return idx
