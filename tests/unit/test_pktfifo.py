"""stellar.hdl.pktfifo: the drop-on-last packet FIFO in the Amaranth simulator.

The reference is the obvious model: a frame is kept when it is not dropped (``i_drop`` with its
last beat) and fits (at most ``depth`` beats, the FIFO being store-and-forward); kept frames
come out whole and in order; a frame longer than the FIFO is accepted, discarded and flagged
with ``i_overflow`` on its last beat.
"""

import pytest
from stellar.hdl.net.layout import beat_layout
from stellar.hdl.pktfifo import PacketFifo
from stellar.sim.amaranth_streams import FrameSink, FrameSource, run_seeds, seeded_rng, simulate

# (data width, depth in beats)
CONFIGS = [(64, 16), (512, 8)]


def run_fifo(width, depth, frames, drops, rng, *, p_valid=1.0, p_ready=1.0, out_reg=False,
             reg_flags=False):
    dut = PacketFifo(beat_layout(width), depth, out_reg=out_reg, reg_flags=reg_flags)
    src = FrameSource(dut.i, frames, rng=rng, p_valid=p_valid, side=(dut.i_drop,),
                      side_values=[int(d) for d in drops], watch=(dut.i_overflow,))
    fits = [-(-len(f) // (width // 8)) <= depth for f in frames]
    kept = [f for f, d, ok in zip(frames, drops, fits, strict=True) if ok and not d]
    sink = FrameSink(dut.o, len(kept), rng=rng, p_ready=p_ready)
    simulate(dut, src, sink, tail=depth + 8)
    assert [w[0] for w in src.watched] == [int(not ok) for ok in fits], "i_overflow"
    assert [g.data for g in sink.frames] == kept
    return src, sink


def random_frames(rng, width, depth, n):
    """Frames of 1 .. depth beats (every tail length), now and then one of depth + 1 ..
    3 * depth beats, with random drop flags."""
    B = width // 8
    frames, drops = [], []
    for _ in range(n):
        beats = rng.randint(depth + 1, 3 * depth) if rng.random() < 0.15 else rng.randint(1, depth)
        frames.append(rng.randbytes((beats - 1) * B + rng.randint(1, B)))
        drops.append(rng.random() < 0.3)
    return frames, drops


@pytest.mark.parametrize("reg_flags", [False, True])
@pytest.mark.parametrize("out_reg", [False, True])
@pytest.mark.parametrize("seed", run_seeds([1, 2, 3]))
@pytest.mark.parametrize("width,depth", CONFIGS)
def test_committed_frames_in_order(width, depth, seed, out_reg, reg_flags):
    """Random frames, drop flags, gaps and backpressure: the output is exactly the frames that
    were neither dropped nor too long, in order; i_overflow flags exactly the too-long ones."""
    rng = seeded_rng(f"pktfifo-random-{width}-{depth}", seed)
    frames, drops = random_frames(rng, width, depth, 150)
    assert any(-(-len(f) // (width // 8)) > depth for f in frames)
    run_fifo(width, depth, frames, drops, rng, p_valid=0.7, p_ready=0.5, out_reg=out_reg,
             reg_flags=reg_flags)


@pytest.mark.parametrize("reg_flags", [False, True])
@pytest.mark.parametrize("out_reg", [False, True])
@pytest.mark.parametrize("width,depth", CONFIGS)
def test_depth_boundary(width, depth, out_reg, reg_flags):
    """A frame of exactly ``depth`` beats is kept; ``depth + 1`` beats is discarded and flagged,
    also when committed frames are still waiting in the FIFO; the frames around it survive.
    Backpressure from a slow reader."""
    rng = seeded_rng(f"pktfifo-boundary-{width}", 3)
    B = width // 8
    sizes = [depth * B, depth * B + 1, 3, depth * B - 1, 2 * B, (depth + 1) * B, depth * B, 1,
             5 * depth * B]
    frames = [rng.randbytes(n) for n in sizes]
    drops = [False, False, False, True, False, False, False, False, False]
    run_fifo(width, depth, frames, drops, rng, p_valid=0.9, p_ready=0.3, out_reg=out_reg,
             reg_flags=reg_flags)


@pytest.mark.parametrize("reg_flags", [False, True])
@pytest.mark.parametrize("out_reg", [False, True])
@pytest.mark.parametrize("width,depth", CONFIGS)
def test_one_beat_per_clock(width, depth, out_reg, reg_flags):
    """Input always valid, output always ready: every input beat is taken on consecutive clocks
    (dropped frames included), equal-length frames leave back to back without a bubble, and a
    committed frame's first beat leaves 2 cycles after its last beat went in (3 with
    ``out_reg``)."""
    rng = seeded_rng(f"pktfifo-rate-{width}", 4)
    B = width // 8
    n_beats = depth // 2 - 1
    frames = [rng.randbytes(n_beats * B - rng.randrange(B)) for _ in range(24)]
    drops = [False] * 12 + [rng.random() < 0.3 for _ in range(12)]
    src, sink = run_fifo(width, depth, frames, drops, rng, out_reg=out_reg, reg_flags=reg_flags)
    cycles = [t.cycle for t in src.transfers]
    assert src.stalls == 0 and cycles == list(range(cycles[0], cycles[0] + len(cycles)))
    out = [c for g in sink.frames[:12] for c in g.cycles]
    assert out == list(range(out[0], out[0] + len(out))), "bubble between committed frames"
    last_in = [t.cycle for t in src.transfers if t.frame == 0][-1]
    assert sink.frames[0].cycles[0] - last_in == (3 if out_reg else 2)
