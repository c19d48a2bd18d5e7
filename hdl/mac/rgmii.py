# Ref: HP/Broadcom/Marvell "Reduced Gigabit Media Independent Interface (RGMII)" v2.0 (2002):
#      TXD/RXD[3:0] on the rising edge, [7:4] on the falling edge; TX_CTL/RX_CTL carry EN/DV on
#      the rising edge and EN xor ER / DV xor ER on the falling edge.
"""RGMII <-> GMII at 1 GbE (125 MHz, DDR nibbles), with the PHY's receive clock as ``eth_rx``.

``RgmiiPhy`` turns the 4-bit double-data-rate RGMII pins into the 8-bit GMII of
``stellar.hdl.mac.gmii`` (``GmiiSignature``, joined to ``MacCore.gmii`` with ``connect``)::

    rx_clk ---------------------------------------------> rx_clk (the top's eth_rx clock)
    rx_data[4], rx_ctl -> DDR in (eth_rx) -> decode -> rxd[8], rx_dv, rx_er   (eth_rx, registered)
    txd[8], tx_en, tx_er (eth_tx) -> encode -> DDR out (eth_tx) -> tx_data[4], tx_ctl
    constant 1/0 -> DDR out (``txc_domain``) -> tx_clk

Encoding: a byte ``b`` with control ``(en, er)`` is ``b[3:0], en`` on the rising edge and
``b[7:4], en ^ er`` on the falling edge; the decoder inverts it (``rx_er = dv_rise ^ ctl_fall``).

Domains, all defined by the top (a domain defined in one block and used by a sibling is on
its way out of Amaranth): ``eth_rx``, clocked by ``rx_clk`` (the PHY's RX clock, out of this
block), e.g. with its reset synchronized from ``eth_tx``'s::

    m.domains.eth_rx = ClockDomain()
    m.d.comb += ClockSignal("eth_rx").eq(phy.rx_clk)
    m.submodules.eth_rx_rst = ResetSynchronizer(ResetSignal("eth_tx"), domain="eth_rx")

and ``eth_tx``, the 125 MHz transmit clock.
``txc_domain`` drives TX_CLK: ``"eth_tx"`` (default) puts clock and data edges together, for
PHYs that delay TX_CLK themselves (RGMII-ID, the usual strap on the ECP5 boards); a top whose
PHY does not can define a 90-degree-shifted copy of ``eth_tx`` (e.g. ``"eth_tx90"`` from the
PLL) and name it here. Receive-side skew is left to the PHY's RX delay by default;
``rx_delay_taps`` (ECP5 only, with ``ports``) instead delays RX_CTL and RXD[3:0] in the input
cells (``DELAYG``, ``DEL_MODE="USER_DEFINED"``, about 25 ps a tap, 0..127) before the DDR
registers, for a PHY whose RX clock is not delayed (RGMII without -ID on the receive side): the
data then lags the clock's arrival at the IDDRs, which have the global-clock insertion delay on
their side. LiteX's ECP5 RGMII PHY does the same with 80 taps (2 ns). Board tops set it per
board (``stellar.hdl.boards.top.Board.rx_delay_taps``).

Two ways to reach the pins:

* ``RgmiiPhy(ports)``: ``ports`` has ``tx_clk``, ``tx_ctl``, ``tx_data`` (4), ``rx_clk``,
  ``rx_ctl``, ``rx_data`` (4) as ``amaranth.lib.io`` ports, e.g.
  ``platform.request("eth_rgmii", 0, dir="-")`` on the amaranth-boards ECP5 boards. Uses
  ``io.DDRBuffer`` (IDDRX1F/ODDRX1F on ECP5, whose extra pipeline stages only add latency) and
  ``io.Buffer`` for RX_CLK.
* ``RgmiiPhy()`` (no ports): the pins are plain signals, member ``pins`` of
  ``RgmiiPinsSignature`` (``txc``, ``tx_ctl``, ``txd`` out; ``rxc``, ``rx_ctl``, ``rxd`` in), and
  the DDR registers are modelled with rising- and falling-edge flip-flops. This runs in the
  Amaranth simulator and in Verilator, where cocotbext-eth's ``RgmiiSource``/``RgmiiSink``
  drive and watch the pins of a generated Verilog top (``stellar.hdl.top.mac``).

Ports (besides ``pins`` in the second form): ``gmii`` In(GmiiSignature()), the MAC's side;
``rx_clk`` Out(1), the receive clock from the pin (for the ``eth_rx`` domain).
Latency: GMII tx -> pins 1 eth_tx clock (model; +2 on ECP5); pins -> GMII rx 2 eth_rx clocks.
"""

from amaranth.hdl import Cat, ClockDomain, ClockSignal, Const, Instance, Module, Mux, Signal
from amaranth.lib import io, wiring
from amaranth.lib.wiring import In, Out

from .gmii import GmiiSignature

__all__ = ["RgmiiPinsSignature", "RgmiiPhy"]


class RgmiiPinsSignature(wiring.Signature):
    """RGMII pins seen from the MAC: ``txc``, ``tx_ctl``, ``txd`` (4) out; ``rxc``, ``rx_ctl``,
    ``rxd`` (4) in."""

    def __init__(self):
        super().__init__({
            "txc":    Out(1),
            "tx_ctl": Out(1),
            "txd":    Out(4),
            "rxc":    In(1),
            "rx_ctl": In(1),
            "rxd":    In(4),
        })


class RgmiiPhy(wiring.Component):
    """RGMII <-> GMII (see the module docstring). Parameters: ``ports`` (None: modelled DDR
    pins on member ``pins``), ``txc_domain`` (domain whose clock is sent on TX_CLK),
    ``rx_delay_taps`` (ECP5 input delay on RX_CTL/RXD, 0 = none)."""

    def __init__(self, ports=None, *, txc_domain="eth_tx", rx_delay_taps=0):
        if not 0 <= rx_delay_taps <= 127 or (rx_delay_taps and ports is None):
            self._MustUse__silence = True  # no "created but never used" warning for a refusal
        if not 0 <= rx_delay_taps <= 127:
            raise ValueError(f"rx_delay_taps {rx_delay_taps} is outside the DELAYG range 0..127")
        if rx_delay_taps and ports is None:
            raise ValueError("rx_delay_taps needs platform ports (an ECP5 input delay)")
        self._ports = ports
        self.txc_domain = txc_domain
        self.rx_delay_taps = rx_delay_taps
        members = {"gmii": In(GmiiSignature()), "rx_clk": Out(1)}
        if ports is None:
            members["pins"] = Out(RgmiiPinsSignature())
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()

        # The five DDR lanes, as (rising-edge half, falling-edge half): data nibble + ctl.
        tx0, tx1 = Signal(5), Signal(5)
        rx0, rx1 = Signal(5), Signal(5)
        g = self.gmii
        m.d.comb += [
            tx0.eq(Cat(g.txd[:4], g.tx_en)),
            tx1.eq(Cat(g.txd[4:], g.tx_en ^ g.tx_er)),
        ]
        m.d.eth_rx += [
            g.rxd.eq(Cat(rx0[:4], rx1[:4])),
            g.rx_dv.eq(rx0[4]),
            g.rx_er.eq(rx0[4] ^ rx1[4]),
        ]
        if self._ports is None:
            self._model_pins(m, tx0, tx1, rx0, rx1)
        else:
            self._buffers(m, tx0, tx1, rx0, rx1)
        return m

    def _buffers(self, m, tx0, tx1, rx0, rx1):
        p = self._ports
        m.submodules.rx_clk = rx_clk = io.Buffer("i", p.rx_clk)
        m.d.comb += self.rx_clk.eq(rx_clk.i)
        if self.rx_delay_taps:
            data_rise, data_fall = self._delayed_ddr_in(m, "rx_data", p.rx_data)
            ctl_rise, ctl_fall = self._delayed_ddr_in(m, "rx_ctl", p.rx_ctl)
        else:
            m.submodules.rx_data = rx_data = io.DDRBuffer("i", p.rx_data, i_domain="eth_rx")
            m.submodules.rx_ctl = rx_ctl = io.DDRBuffer("i", p.rx_ctl, i_domain="eth_rx")
            data_rise, data_fall = rx_data.i[0], rx_data.i[1]
            ctl_rise, ctl_fall = rx_ctl.i[0], rx_ctl.i[1]
        m.submodules.tx_data = tx_data = io.DDRBuffer("o", p.tx_data, o_domain="eth_tx")
        m.submodules.tx_ctl = tx_ctl = io.DDRBuffer("o", p.tx_ctl, o_domain="eth_tx")
        m.submodules.tx_clk = tx_clk = io.DDRBuffer("o", p.tx_clk, o_domain=self.txc_domain)
        m.d.comb += [
            rx0.eq(Cat(data_rise, ctl_rise)),
            rx1.eq(Cat(data_fall, ctl_fall)),
            tx_data.o[0].eq(tx0[:4]), tx_data.o[1].eq(tx1[:4]),
            tx_ctl.o[0].eq(tx0[4]), tx_ctl.o[1].eq(tx1[4]),
            tx_clk.o[0].eq(1), tx_clk.o[1].eq(0),
        ]

    def _delayed_ddr_in(self, m, name, port):
        """What ``io.DDRBuffer("i", port, i_domain="eth_rx")`` builds on ECP5 (input buffer,
        then ``IDDRX1F`` per bit: ``i[0]`` the rising-edge sample, ``i[1]`` the falling-edge one)
        with a ``DELAYG`` between the buffer and the DDR register."""
        m.submodules[name] = buf = io.Buffer("i", port)
        width = len(port)
        q0, q1 = Signal(width, name=f"{name}_q0"), Signal(width, name=f"{name}_q1")
        for bit in range(width):
            delayed = Signal(name=f"{name}_delayed{bit}")
            m.submodules[f"{name}_delay{bit}"] = Instance(
                "DELAYG", p_DEL_MODE="USER_DEFINED", p_DEL_VALUE=self.rx_delay_taps,
                i_A=buf.i[bit], o_Z=delayed)
            m.submodules[f"{name}_ddr{bit}"] = Instance(
                "IDDRX1F", i_SCLK=ClockSignal("eth_rx"), i_RST=Const(0), i_D=delayed,
                o_Q0=q0[bit], o_Q1=q1[bit])
        return q0, q1

    def _model_pins(self, m, tx0, tx1, rx0, rx1):
        # Behavioural DDR registers with the same cycle semantics as io.DDRBuffer (input: the
        # rising-edge sample and the falling-edge sample after it appear together on the next
        # rising edge; output: the rising half is on the pin after a rising edge, the falling
        # half after the falling edge that follows).
        pins = self.pins
        m.domains.eth_rx_fall = ClockDomain("eth_rx_fall", clk_edge="neg", reset_less=True,
                                            local=True)
        m.domains.eth_tx_fall = ClockDomain("eth_tx_fall", clk_edge="neg", reset_less=True,
                                            local=True)
        m.d.comb += [
            self.rx_clk.eq(pins.rxc),
            ClockSignal("eth_rx_fall").eq(pins.rxc),
            ClockSignal("eth_tx_fall").eq(ClockSignal("eth_tx")),
        ]
        pin_in = Cat(pins.rxd, pins.rx_ctl)
        rise, fall = Signal(5), Signal(5)
        m.d.eth_rx += [rise.eq(pin_in), rx0.eq(rise), rx1.eq(fall)]
        m.d.eth_rx_fall += fall.eq(pin_in)

        out_rise, out_fall_early, out_fall = Signal(5), Signal(5), Signal(5)
        m.d.eth_tx += [out_rise.eq(tx0), out_fall_early.eq(tx1)]
        m.d.eth_tx_fall += out_fall.eq(out_fall_early)
        pin_out = Mux(ClockSignal("eth_tx"), out_rise, out_fall)
        m.d.comb += [
            pins.txd.eq(pin_out[:4]),
            pins.tx_ctl.eq(pin_out[4]),
            pins.txc.eq(ClockSignal(self.txc_domain)),
        ]
