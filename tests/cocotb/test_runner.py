"""Tests of the simulation infrastructure: Verilog export cache, cocotb runner, TB helpers.

The design under test is a small AXI-Stream register slice declared here, so these tests
depend on no gateware of the project.
"""

import functools
import multiprocessing
import os
from pathlib import Path

import pytest
from amaranth import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from stellar.sim import verilog
from stellar.sim.runner import CocotbTestFailure, run_cocotb, tb_env, verilator_env
from stellar.sim.verilog import export_verilog, param_slug

TB_MODULE = Path(__file__).with_name("tb_runner_smoke.py")


class AxiStreamRegSlice(wiring.Component):
    """Full-throughput AXI-Stream register slice: registered outputs and a registered tready.

    A one-beat skid buffer catches the beat accepted in the cycle ``m_axis_tready`` falls, so
    ``s_axis_tready`` can be a flop and the slice still moves one beat per clock.

    Ports: ``s_axis_t{data,keep,last,valid,ready}`` in, ``m_axis_t{data,keep,last,valid,ready}``
    out, plus ``clk``/``rst`` from the ``sync`` domain.
    Parameters: ``width``, tdata bits (a multiple of 8; tkeep has ``width // 8`` bits).
    """

    def __init__(self, width):
        self.width = width
        super().__init__({
            "s_axis_tdata":  In(width),
            "s_axis_tkeep":  In(width // 8),
            "s_axis_tlast":  In(1),
            "s_axis_tvalid": In(1),
            "s_axis_tready": Out(1),
            "m_axis_tdata":  Out(width),
            "m_axis_tkeep":  Out(width // 8),
            "m_axis_tlast":  Out(1),
            "m_axis_tvalid": Out(1),
            "m_axis_tready": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        beat_in = Cat(self.s_axis_tdata, self.s_axis_tkeep, self.s_axis_tlast)
        beat_out = Cat(self.m_axis_tdata, self.m_axis_tkeep, self.m_axis_tlast)
        skid = Signal(len(beat_in))
        skid_valid = Signal()

        m.d.comb += self.s_axis_tready.eq(~skid_valid)
        with m.If(self.m_axis_tready | ~self.m_axis_tvalid):
            # The output register is free: refill it, from the skid buffer first (order).
            with m.If(skid_valid):
                m.d.sync += [beat_out.eq(skid), self.m_axis_tvalid.eq(1), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [beat_out.eq(beat_in), self.m_axis_tvalid.eq(self.s_axis_tvalid)]
        with m.Elif(self.s_axis_tvalid & self.s_axis_tready):
            # Output stalled but tready was still high this cycle: park the beat.
            m.d.sync += [skid.eq(beat_in), skid_valid.eq(1)]
        return m


def _run_slice(width, **tb_params):
    params = {"width": width}
    src = export_verilog("axis_reg_slice", AxiStreamRegSlice, params)
    return run_cocotb(toplevel="axis_reg_slice", verilog_sources=[src], test_module=TB_MODULE,
                      params_slug=param_slug(params), extra_env=tb_env({**params, **tb_params}))


@pytest.mark.parametrize("width", [8, 64])
def test_frames_through_reg_slice(width):
    results = _run_slice(width)
    assert results.is_file()
    assert results.parent.parent.name == f"width{width}"


def test_identical_verilog_at_new_path_does_not_rebuild(tmp_path):
    # What an edit to an unrelated stellar.hdl file does: same Verilog text, new cache path.
    params = {"width": 8}
    src = export_verilog("axis_reg_slice", AxiStreamRegSlice, params)
    kwargs = dict(toplevel="axis_reg_slice", test_module=TB_MODULE, params_slug=param_slug(params),
                  extra_env=tb_env({**params, "frames": 2}))
    results = run_cocotb(verilog_sources=[src], **kwargs)
    binary = results.parent.parent / "axis_reg_slice"
    built = binary.stat().st_mtime_ns
    moved = tmp_path / "axis_reg_slice.v"
    moved.write_bytes(src.read_bytes())
    run_cocotb(verilog_sources=[moved], **kwargs)
    assert binary.stat().st_mtime_ns == built


def test_failing_cocotb_test_fails_run():
    # Same design and parameter set as test_frames_through_reg_slice[8]: the two share one build
    # (under xdist possibly at the same time, serialized by the build lock) in their own run dirs.
    with pytest.raises(CocotbTestFailure) as failure:
        _run_slice(8, corrupt=True)
    message = str(failure.value)
    assert "1 of 1 cocotb tests failed" in message
    assert "frames_pass_unchanged" in message
    assert "COCOTB_RANDOM_SEED=" in message


def test_missing_test_module_is_reported():
    with pytest.raises(ModuleNotFoundError):
        run_cocotb(toplevel="x", verilog_sources=[], test_module="stellar.sim.no_such_tb",
                   params_slug="default")


def test_verilator_env_is_idempotent():
    first = dict(verilator_env())
    second = dict(verilator_env())
    assert first["PATH"] == second["PATH"]
    root = Path(second["VERILATOR_ROOT"])
    assert (root / "bin" / "verilator").is_file()
    assert second["PATH"].split(os.pathsep)[0] == str(root / "bin")


def test_param_slug():
    assert param_slug({"width": 512}) == "width512"
    assert param_slug({"width": 64, "vlan": True}) == "vlan1-width64"
    assert param_slug({}) == "default"
    # Lossy renderings get a hash so distinct parameter sets never share a directory.
    assert param_slug({"mode": "a/b"}) != param_slug({"mode": "a_b"})
    assert "/" not in param_slug({"mode": "a/b"})


class _CountingFactory:
    """Factory that records each call in a file, so calls are counted across processes."""

    def __init__(self, log: Path):
        self.log = log

    def __call__(self, **params):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return AxiStreamRegSlice(**params)


def _calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_export_cache(tmp_path):
    log = tmp_path / "calls"
    factory = _CountingFactory(log)
    first = export_verilog("axis_reg_slice", factory, {"width": 8}, build_root=tmp_path)
    assert first.is_file() and _calls(log) == 1
    assert first.parent.name.startswith("width8-")
    assert first == tmp_path.resolve() / "verilog" / "axis_reg_slice" / first.parent.name / "axis_reg_slice.v"
    assert "module axis_reg_slice(" in first.read_text()
    mtime = first.stat().st_mtime_ns

    again = export_verilog("axis_reg_slice", factory, {"width": 8}, build_root=tmp_path)
    assert again == first and _calls(log) == 1 and first.stat().st_mtime_ns == mtime

    other = export_verilog("axis_reg_slice", factory, {"width": 16}, build_root=tmp_path)
    assert other != first and other.parent.name.startswith("width16-") and _calls(log) == 2

    # A partial's bound arguments shape the design as much as params do.
    narrow = export_verilog("axis_reg_slice", functools.partial(AxiStreamRegSlice, width=8), {},
                            build_root=tmp_path)
    wide = export_verilog("axis_reg_slice", functools.partial(AxiStreamRegSlice, width=16), {},
                          build_root=tmp_path)
    assert narrow != wide and narrow.parent.name.startswith("default-")


def test_export_cache_follows_gateware_sources(tmp_path, monkeypatch):
    # Stand-in for the stellar.hdl package: editing any file in it must regenerate.
    hdl = tmp_path / "hdl"
    hdl.mkdir()
    (hdl / "block.py").write_text("X = 1\n")
    monkeypatch.setattr(verilog, "_hdl_package_dir", lambda: hdl)
    first = export_verilog("axis_reg_slice", AxiStreamRegSlice, {"width": 8}, build_root=tmp_path)
    (hdl / "block.py").write_text("X = 2\n")
    second = export_verilog("axis_reg_slice", AxiStreamRegSlice, {"width": 8}, build_root=tmp_path)
    assert first != second and first.is_file() and second.is_file()


def _export_in_child(build_root, log):
    export_verilog("axis_reg_slice", _CountingFactory(Path(log)), {"width": 32}, build_root=build_root)


def test_export_cache_concurrent(tmp_path):
    # Two processes (as two xdist workers would) ask for the same file at once: one converts,
    # the other waits on the lock and reuses the result.
    log = tmp_path / "calls"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_export_in_child, args=(tmp_path, log)) for _ in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    assert _calls(log) == 1
    files = list((tmp_path / "verilog" / "axis_reg_slice").glob("*/axis_reg_slice.v"))
    assert len(files) == 1
    assert not list(files[0].parent.glob("*.tmp"))
