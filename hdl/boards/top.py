# Ref: Lattice FPGA-TN-02200 "ECP5 and ECP5-5G sysCLOCK PLL/DLL Design and Usage Guide" (EHXPLLL);
#      RGMII v2.0; IEEE 802.3-2018 clauses 3, 35
"""Board tops: the NIC core on an ECP5 board with RGMII 1 GbE, a UART control bridge and block
RAM as device memory, plus the same top with modelled pins for simulation.

::

     board clock -> EHXPLLL -> sync (core, core_mhz), eth_tx (125 MHz), eth_tx90 (125 MHz, +90 deg)

     RGMII pins <-> RgmiiPhy <-> MacCore (async FIFOs, 8 <-> W bits) <-> NicCore s_axis_rx / m_axis_tx
                                   | counters ----------------------------+
     UART rx/tx <-> UartBridge --> AxiLiteSplit --+--> NicCore.s_axil     |
                                                   +--> board CSR bank: mac <-+, wq <-> RegisterQueues
                                                                          s_axis_wr/rr, m_axis_cq
     NicCore.m_axi --> Axi4Ram (block RAM, "device memory" at bus address 0)

The register space is one map (``stellar.hdl.regmap.REGMAP``): NicCore's bank serves every
block but ``mac`` and ``wq``, which live in a small bank here (same map, so ``ident`` lists them
and the driver finds them by feature id). ``mac`` counts the MAC's events; ``wq`` is the host's
work-request, receive-request and completion queues through registers (``RegisterQueues``).

A host registers device memory with bus addresses ``0 .. devmem_bytes-1`` (memory regions with
``bus_base`` in that range); an access outside it is answered SLVERR by ``Axi4Ram``.

Board catalogue (``BOARDS``): ``ecpix5`` (LFE5UM5G-85F, the full core, 256 QPs),
``versa_ecp5_5g`` (LFE5UM5G-45F) and ``colorlight_5a75b`` (r7.0, LFE5U-25F), both too small for
the core (~63k LUT4 cells at 16 QPs) and so building the shell by default, and ``ulx3s_85f``
(LFE5U-85F, no Ethernet: the core's transmit stream is looped to its receive stream, a resource
and timing target).

The shell (``BoardConfig(core=False)``): no NicCore; the bridge reaches a bank of ``ident`` and
``mac`` only, and the MAC sends back every frame it receives: the bring-up image for the MAC,
PHY and bridge on a part that cannot hold the core.

Each entry names its amaranth-boards platform, whether its PHY needs the FPGA to delay TX_CLK
(``txc_delay``: the 90-degree PLL output drives TX_CLK), whether it needs the FPGA to delay the
receive data against RX_CLK (``rx_delay_taps``: ECP5 ``DELAYG`` taps of about 25 ps on RX_CTL
and RXD, 0 = none, for a PHY without its own RX clock delay; see ``stellar.hdl.mac.rgmii``) and
its ``BoardConfig``.

Simulation: ``BoardTop(None, config)`` has no platform and exposes pins instead (``stellar_board``
Verilog top, ``python -m stellar.hdl.boards.top -o build/verilog``):
  ``clk``, ``rst``                    core clock domain (``sync``)
  ``eth_tx_clk``, ``eth_tx_rst``      125 MHz transmit clock and its reset (``eth_rx`` takes this
                                      reset, synchronized to ``rgmii_rxc``)
  ``eth_tx90_clk``                    ``eth_tx_clk`` 2 ns later, drives ``rgmii_txc``
  ``rgmii_txc``, ``rgmii_tx_ctl``, ``rgmii_txd[3:0]``, ``rgmii_rxc``, ``rgmii_rx_ctl``,
  ``rgmii_rxd[3:0]``                  the PHY pins (DDR registers modelled, as in ``stellar_mac``)
  ``uart_rx`` (in, idle 1), ``uart_tx`` (out, idle 1)   the control bridge's serial line
"""

import argparse
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

from amaranth.back import verilog
from amaranth.hdl import ClockDomain, ClockSignal, Instance, Module, ResetSignal, Signal
from amaranth.lib import io, wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import In, Out

from ..axil import FlatPorts
from ..bridge.uart import UartBridge
from ..csr import AxiLiteCsrBank
from ..mac.cdc import COUNTERS, MacCore
from ..mac.rgmii import RgmiiPhy, RgmiiPinsSignature
from ..regmap import MAC_COUNTERS, REGMAP, RegisterMap
from ..top.nic import CQ_BITS, RR_BITS, WR_BITS, NicCore
from .axilsplit import AxiLiteSplit
from .axiram import Axi4Ram
from .wq import RegisterQueues

__all__ = ["BoardConfig", "Board", "BOARDS", "BoardTop", "PllConfig", "pll_config", "TOP_NAME",
           "ETH_HZ", "verilog_top", "convert"]

TOP_NAME = "stellar_board"
ETH_HZ = 125_000_000        # RGMII at 1 GbE: 125 MHz, a byte per clock in GMII terms
BOARD_BLOCKS = ("mac", "wq")

assert tuple(name for name, _ in MAC_COUNTERS) == COUNTERS, "regmap.MAC_COUNTERS out of step"


@dataclass(frozen=True)
class BoardConfig:
    """What a board top builds. ``qps`` ... ``mr_pages``: ``NicCore``'s parameters;
    ``data_width``: core datapath bits; ``core_mhz``: core clock (the PLL picks the nearest it
    can make; ``pll_config``); ``devmem_bytes``: block-RAM device memory; ``baud``: UART rate;
    ``wr_depth`` / ``rr_depth`` / ``cq_depth``: the register queues; ``rx_fifo_bytes`` /
    ``tx_fifo_bytes``: the MAC's receive / transmit packet FIFOs (2048 bytes is one EBR on ECP5,
    4096 two behind a 2:1 mux, which costs the block RAM's slow output a LUT on the way to its
    register: the 25F at speed 6 takes 2048 to meet 125 MHz; one 1522-byte frame plus the next
    one's head still keeps line rate, the next frame filling as the current one drains);
    ``core``: False builds the shell without ``NicCore`` (the bridge reaches ident and the mac
    block, the MAC echoes what it receives), the board bring-up image for a part that cannot
    hold the core."""
    qps: int = 256
    data_width: int = 64
    core_mhz: float = 125.0
    devmem_bytes: int = 64 * 1024
    sq_depth: int = 16
    rq_depth: int = 16
    mr_entries: int = 64
    mr_pages: int = 64
    baud: int = 115200
    wr_depth: int = 4
    rr_depth: int = 4
    cq_depth: int = 16
    rx_fifo_bytes: int = 4096
    tx_fifo_bytes: int = 4096
    core: bool = True

    def describe(self):
        if not self.core:
            return (f"shell without the NIC core (MAC echo + UART bridge + mac registers), "
                    f"{self.data_width}-bit, core {self.core_mhz:g} MHz")
        return (f"{self.qps} QPs, {self.data_width}-bit, core {self.core_mhz:g} MHz, "
                f"{self.devmem_bytes // 1024} KiB device memory, SQ/RQ depth {self.sq_depth}/"
                f"{self.rq_depth}, {self.mr_entries} MRs")


@dataclass(frozen=True)
class Board:
    name: str
    platform: str           # "module:Class" in amaranth_boards
    device: str
    ethernet: bool = True
    txc_delay: bool = False  # the FPGA delays TX_CLK by 90 degrees (PHY without TX delay)
    rx_delay_taps: int = 0   # ECP5 input delay on RX_CTL/RXD (PHY without RX delay), ~25 ps/tap
    config: BoardConfig = BoardConfig()

    def platform_class(self):
        import importlib
        module, cls = self.platform.split(":")
        return getattr(importlib.import_module(f"amaranth_boards.{module}"), cls)


# The 85F parts: 256 QPs. Block RAM, not logic, is what limits them: at SQ/RQ depth 16 and
# 64 KiB of device memory the build needs 358 EBR of 208 (send queue 72 + inline data 58 +
# receive queue 36 + device memory 32 + the rest 160); depth 4 and 8 KiB need 206 (measured:
# LUT4 at 75 %, FF at 42 % either way).
FULL_85F = BoardConfig(qps=256, sq_depth=4, rq_depth=4, devmem_bytes=8 * 1024)

BOARDS = {b.name: b for b in (
    # ECPIX-5: RTL8211E PHY, assumed without TX delay: the FPGA shifts TX_CLK (as LiteX's
    # target does; check the strap on a real board).
    Board("ecpix5", "ecpix5:ECPIX585Platform", "LFE5UM5G-85F", txc_delay=True, config=FULL_85F),
    # Versa ECP5-5G: 88E1512 PHY, assumed strapped without internal delays. Its 45F (43,848
    # LUT4) cannot hold NicCore either (~63k LUT4 cells at 16 QPs): the shell by default.
    Board("versa_ecp5_5g", "versa_ecp5_5g:VersaECP55GPlatform", "LFE5UM5G-45F", txc_delay=True,
          config=BoardConfig(qps=16, devmem_bytes=32 * 1024, core=False)),
    # Colorlight 5A-75B r7.0: B50612D PHY, assumed with its TX delay on. The 25F cannot hold NicCore
    # (16 QPs: ~63k LUT4 cells, 85 EBR, 43 DSP against 24k, 56, 28): its default is the shell.
    Board("colorlight_5a75b", "colorlight_5a75b_r7_0:Colorlight_5A75B_R70Platform", "LFE5U-25F",
          config=BoardConfig(qps=16, devmem_bytes=8 * 1024, sq_depth=8, rq_depth=8, mr_entries=16,
                             mr_pages=16, rx_fifo_bytes=2048, tx_fifo_bytes=2048, cq_depth=8,
                             core=False)),
    # ULX3S-85F: no Ethernet; a resource and timing target for the full core.
    Board("ulx3s_85f", "ulx3s:ULX3S_85F_Platform", "LFE5U-85F", ethernet=False, config=FULL_85F),
)}


@dataclass(frozen=True)
class PllConfig:
    """EHXPLLL settings: feedback from CLKOP (``eth_tx``); CLKOS is ``eth_tx`` + 90 degrees,
    CLKOS2 the core clock. Frequencies in Hz."""
    clki_div: int
    clkfb_div: int
    op_div: int
    os2_div: int
    vco_hz: float
    core_hz: float


def pll_config(fin_hz, core_hz):
    """Dividers giving 125 MHz on CLKOP (fed back) and the achievable core clock nearest to
    ``core_hz`` on CLKOS2 (same VCO). ECP5 limits: VCO 400..800 MHz, phase detector 10..400 MHz,
    CLKI_DIV 1..128, CLKFB_DIV 1..80, output dividers 1..128."""
    ratio = Fraction(ETH_HZ) / Fraction(fin_hz)          # = CLKFB_DIV / CLKI_DIV
    best = None
    for i_div in range(1, 129):
        fb_div = ratio * i_div
        if fb_div.denominator != 1 or not 1 <= fb_div <= 80 or not 10e6 <= fin_hz / i_div <= 400e6:
            continue
        for op_div in range(1, 129):
            vco = ETH_HZ * op_div
            if not 400e6 <= vco <= 800e6:
                continue
            os2_div = max(1, min(128, round(vco / core_hz)))
            got = vco / os2_div
            key = (abs(got - core_hz), -vco)
            if best is None or key < best[0]:
                best = (key, PllConfig(i_div, int(fb_div), op_div, os2_div, vco, got))
        if best is not None:
            break
    if best is None:
        raise ValueError(f"no EHXPLLL setting makes 125 MHz from {fin_hz / 1e6:g} MHz")
    return best[1]


def _pll_instance(cfg, fin_hz, clkin, clkop, clkos, clkos2, locked):
    # CPHASE/FPHASE as prjtrellis' ecppll computes them: CLKOP's coarse phase is half its
    # divider; a secondary output adds its phase in VCO periods (coarse) and eighths (fine).
    op_cphase = cfg.op_div // 2
    quarter = cfg.op_div / 4                    # 90 degrees of CLKOS, in VCO periods
    return Instance(
        "EHXPLLL",
        a_FREQUENCY_PIN_CLKI=f"{fin_hz / 1e6:g}",
        a_FREQUENCY_PIN_CLKOP=f"{ETH_HZ / 1e6:g}",
        a_FREQUENCY_PIN_CLKOS=f"{ETH_HZ / 1e6:g}",
        a_FREQUENCY_PIN_CLKOS2=f"{cfg.core_hz / 1e6:g}",
        a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1", a_MFG_GMCREF_SEL="2",
        p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
        p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
        p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
        p_CLKI_DIV=cfg.clki_div, p_FEEDBK_PATH="CLKOP", p_CLKFB_DIV=cfg.clkfb_div,
        p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=cfg.op_div, p_CLKOP_CPHASE=op_cphase,
        p_CLKOP_FPHASE=0,
        p_CLKOS_ENABLE="ENABLED", p_CLKOS_DIV=cfg.op_div,
        p_CLKOS_CPHASE=op_cphase + int(quarter), p_CLKOS_FPHASE=round((quarter % 1) * 8),
        p_CLKOS2_ENABLE="ENABLED", p_CLKOS2_DIV=cfg.os2_div, p_CLKOS2_CPHASE=op_cphase,
        p_CLKOS2_FPHASE=0,
        i_RST=0, i_STDBY=0, i_CLKI=clkin, i_CLKFB=clkop, i_PHASESEL0=0, i_PHASESEL1=0,
        i_PHASEDIR=1, i_PHASESTEP=1, i_PHASELOADREG=1, i_PLLWAKESYNC=0, i_ENCLKOP=0,
        o_CLKOP=clkop, o_CLKOS=clkos, o_CLKOS2=clkos2, o_LOCK=locked,
    )


def _rgmii_ports(res):
    # amaranth-boards names the control pins tx_ctl/rx_ctl on most boards, tx_ctrl/rx_ctrl on
    # the ECPIX-5; RgmiiPhy wants the former.
    def pick(*names):
        for n in names:
            if hasattr(res, n):
                return getattr(res, n)
        raise AttributeError(f"RGMII resource has none of {names}")
    return SimpleNamespace(tx_clk=res.tx_clk, tx_ctl=pick("tx_ctl", "tx_ctrl"), tx_data=res.tx_data,
                           rx_clk=res.rx_clk, rx_ctl=pick("rx_ctl", "rx_ctrl"), rx_data=res.rx_data)


class BoardTop(wiring.Component):
    """See the module docstring. Parameters: ``board`` (a ``Board``, or ``None`` for the
    simulation top with modelled pins), ``config`` (default: the board's), ``uart_divisor``
    (clocks per UART bit; default ``core clock // baud``), ``pll_fin_hz`` (board clock; default
    from the platform)."""

    def __init__(self, board=None, config=None, *, uart_divisor=None, sim_core_hz=156_250_000):
        self.board = board
        self.config = config or (board.config if board else BoardConfig(qps=16))
        self._uart_divisor = uart_divisor
        self._sim_core_hz = sim_core_hz
        self.pll = None
        self.rx_clk_port = None
        members = {}
        if board is None:
            members = {
                "eth_tx_clk":   In(1),
                "eth_tx_rst":   In(1),
                "eth_tx90_clk": In(1),
                "rgmii":        Out(RgmiiPinsSignature()),
                "uart_rx":      In(1, init=1),
                "uart_tx":      Out(1, init=1),
            }
        super().__init__(members)

    @property
    def core_hz(self):
        return self.pll.core_hz if self.pll else self._sim_core_hz

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        W = cfg.data_width
        ethernet = self.board is None or self.board.ethernet

        # --- clocks ----------------------------------------------------------------------------
        if self.board is None:
            m.domains.eth_tx = ClockDomain("eth_tx")
            m.domains.eth_tx90 = ClockDomain("eth_tx90", reset_less=True)
            m.d.comb += [ClockSignal("eth_tx").eq(self.eth_tx_clk),
                         ResetSignal("eth_tx").eq(self.eth_tx_rst),
                         ClockSignal("eth_tx90").eq(self.eth_tx90_clk)]
            uart_rx, uart_tx = self.uart_rx, self.uart_tx
        else:
            uart_rx, uart_tx = self._board_clocks(m, platform)

        # --- blocks ----------------------------------------------------------------------------
        divisor = self._uart_divisor or int(self.core_hz // cfg.baud)
        m.submodules.bridge = bridge = UartBridge(divisor)
        m.d.comb += [bridge.rx.eq(uart_rx), uart_tx.eq(bridge.tx)]
        if cfg.core:
            m.submodules.nic = nic = NicCore(W, qps=cfg.qps, sq_depth=cfg.sq_depth,
                                             rq_depth=cfg.rq_depth, mr_entries=cfg.mr_entries,
                                             mr_pages=cfg.mr_pages)
            windows = [(REGMAP.block(b).base, REGMAP.block(b).size) for b in BOARD_BLOCKS]
            m.submodules.split = split = AxiLiteSplit(16, windows)
            board_map = RegisterMap([REGMAP.block(b) for b in BOARD_BLOCKS], version=REGMAP.version)
            m.submodules.bank = bank = AxiLiteCsrBank(board_map)
            m.submodules.ram = ram = Axi4Ram(cfg.devmem_bytes, data_width=W, addr_width=64,
                                             id_width=4)
            m.submodules.queues = queues = RegisterQueues(
                wr_bits=WR_BITS, rr_bits=RR_BITS, cq_bits=CQ_BITS, wr_depth=cfg.wr_depth,
                rr_depth=cfg.rr_depth, cq_depth=cfg.cq_depth)
            wiring.connect(m, bridge.m_axil, split.s_axil)
            wiring.connect(m, split.m_axil0, nic.s_axil)
            wiring.connect(m, split.m_axil1, bank.s_axil)
            wiring.connect(m, queues.csr, bank.wq)
            wiring.connect(m, queues.m_axis_wr, nic.s_axis_wr)
            wiring.connect(m, queues.m_axis_rr, nic.s_axis_rr)
            wiring.connect(m, nic.m_axis_cq, queues.s_axis_cq)
            wiring.connect(m, nic.m_axi, ram.s_axi)
        else:
            # The shell: the bridge reaches a bank of ident + mac only (the driver sees a device
            # whose one feature is the MAC), and received frames are sent back (echo).
            m.submodules.bank = bank = AxiLiteCsrBank(
                RegisterMap([REGMAP.block("mac")], version=REGMAP.version))
            wiring.connect(m, bridge.m_axil, bank.s_axil)

        if ethernet:
            m.domains.eth_rx = ClockDomain("eth_rx")
            if self.board is None:
                phy = RgmiiPhy(txc_domain="eth_tx90")
            else:
                res = platform.request("eth_rgmii", 0, dir="-")
                phy = RgmiiPhy(_rgmii_ports(res),
                               txc_domain="eth_tx90" if self.board.txc_delay else "eth_tx",
                               rx_delay_taps=self.board.rx_delay_taps)
                # PHY out of reset (the pin is active low; the resource inverts it).
                m.submodules.phy_rst = phy_rst = io.Buffer("o", res.rst)
                m.d.comb += phy_rst.o.eq(0)
                # RX_CLK's constraint goes on its pin (stellar.hdl.boards.build writes it into
                # the LPF): the net behind the input buffer is renamed by synthesis.
                self.rx_clk_port = res.rx_clk
            m.submodules.phy = phy
            m.submodules.mac = mac = MacCore(W, rx_fifo_bytes=cfg.rx_fifo_bytes,
                                                 tx_fifo_bytes=cfg.tx_fifo_bytes)
            m.submodules.eth_rx_rst = ResetSynchronizer(ResetSignal("eth_tx"), domain="eth_rx")
            m.d.comb += ClockSignal("eth_rx").eq(phy.rx_clk)
            if self.board is None:
                wiring.connect(m, wiring.flipped(self.rgmii), phy.pins)
            wiring.connect(m, mac.gmii, phy.gmii)
            if cfg.core:
                wiring.connect(m, mac.m_axis_rx, nic.s_axis_rx)
                wiring.connect(m, nic.m_axis_tx, mac.s_axis_tx)
            else:
                wiring.connect(m, mac.m_axis_rx, mac.s_axis_tx)
            for name in COUNTERS:
                m.d.comb += getattr(bank.mac, f"{name}_inc").eq(getattr(mac.counters, name))
        else:
            # No Ethernet on the board: the core talks to itself, so nothing is optimized away.
            wiring.connect(m, nic.m_axis_tx, nic.s_axis_rx)
        return m

    def _board_clocks(self, m, platform):
        clk_res = platform.request(platform.default_clk, dir="-")
        fin_hz = platform.default_clk_frequency
        self.pll = pll = pll_config(fin_hz, self.config.core_mhz * 1e6)
        m.submodules.clk_buf = clk_buf = io.Buffer("i", clk_res)
        # Named so that the build report can tell the domains apart (stellar.hdl.boards.build).
        clkop, clkos = Signal(name="clk_eth_tx"), Signal(name="clk_eth_tx90")
        clkos2, locked = Signal(name="clk_core"), Signal(name="pll_locked")
        m.submodules.pll = _pll_instance(pll, fin_hz, clk_buf.i, clkop, clkos, clkos2, locked)
        m.domains.sync = cd_sync = ClockDomain("sync")
        m.domains.eth_tx = cd_tx = ClockDomain("eth_tx")
        m.domains.eth_tx90 = cd_tx90 = ClockDomain("eth_tx90", reset_less=True)
        m.d.comb += [cd_sync.clk.eq(clkos2), cd_tx.clk.eq(clkop), cd_tx90.clk.eq(clkos)]
        # Everything stays in reset until the PLL locks; each domain leaves it on its own clock.
        # The core's reset reaches the LSR pin of some 25,000 flip-flops: nextpnr puts only
        # clocks on the global network by itself, so in general routing that one net would span
        # the die and take wires from the rest. A DCCA puts it on a global (nextpnr routes
        # globals to LSR pins too; the ECPIX-5 core's placement estimate did not change with it).
        # The synchronizer runs in a domain of its own on the core clock, whose reset is its output.
        m.domains.sync_rst_src = cd_rst = ClockDomain("sync_rst_src")
        m.d.comb += cd_rst.clk.eq(clkos2)
        m.submodules.sync_rst = ResetSynchronizer(~locked, domain="sync_rst_src")
        m.submodules.sync_rst_dcc = Instance("DCCA", i_CLKI=cd_rst.rst, i_CE=1, o_CLKO=cd_sync.rst)
        m.submodules.eth_tx_rst = ResetSynchronizer(~locked, domain="eth_tx")
        # nextpnr derives the PLL outputs' constraints from the board clock's and the dividers;
        # these name the nets for the log (synthesis may rename some, nextpnr then warns).
        platform.add_clock_constraint(clkos2, pll.core_hz)
        platform.add_clock_constraint(clkop, ETH_HZ)
        platform.add_clock_constraint(clkos, ETH_HZ)

        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_rx = rx_buf = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = tx_buf = io.Buffer("o", uart.tx)
        if self.board.name == "ulx3s_85f":
            # The ULX3S's FTDI shares its TX line; this pin enables the FPGA's driver.
            en = platform.request("uart_tx_enable", 0, dir="-")
            m.submodules.uart_tx_en = en_buf = io.Buffer("o", en)
            m.d.comb += en_buf.o.eq(1)
        return rx_buf.i, tx_buf.o


def verilog_top(config=None, uart_divisor=8):
    """The simulation top ``stellar_board`` (modelled pins) with flat port names."""
    return FlatPorts(BoardTop(None, config or BoardConfig(qps=16, devmem_bytes=16 * 1024),
                              uart_divisor=uart_divisor))


def convert(config=None, uart_divisor=8):
    return verilog.convert(verilog_top(config, uart_divisor), name=TOP_NAME)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.hdl.boards.top",
                                 description="Write the stellar_board simulation top (modelled pins).")
    ap.add_argument("--qps", type=int, default=16)
    ap.add_argument("--uart-divisor", type=int, default=8, help="core clocks per UART bit")
    ap.add_argument("-o", "--output", default="build/verilog")
    args = ap.parse_args(argv)
    cfg = replace(BoardConfig(), qps=args.qps, devmem_bytes=16 * 1024)
    out = Path(args.output) / f"{TOP_NAME}_q{args.qps}.v"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(convert(cfg, args.uart_divisor))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
