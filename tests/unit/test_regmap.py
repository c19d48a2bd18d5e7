"""stellar.hdl.regmap: structure of the one register map, feature discovery, CLI."""

import json
import subprocess
import sys

import pytest
from stellar.hdl import regmap
from stellar.hdl.regmap import (
    ACCESS,
    BLOCK_SIZE,
    FEATURE_PKTENGINE,
    MAGIC,
    REGMAP,
    Block,
    Register,
    RegisterMap,
    decode_feature,
    decode_version,
    encode_feature,
    encode_version,
)

PKTENGINE_COUNTERS = [
    "rx_frames", "rx_roce", "rx_non_roce", "rx_ecn_ce", "rx_drop_icrc", "rx_drop_ip_checksum",
    "rx_drop_malformed", "rx_drop_opcode", "tx_frames",
]
REQUIRED = (["ident.id", "ident.version", "ident.feature_count", "ident.feature0", "ident.scratch",
             "pktengine.config", "pktengine.counters_clear"]
            + [f"pktengine.{name}" for name in PKTENGINE_COUNTERS])


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "stellar.hdl.regmap", *args],
                          capture_output=True, text=True, timeout=60)


def _records():
    return json.loads(REGMAP.to_json())


def test_json_records_well_formed():
    records = _records()
    assert len(records) == len(REGMAP) > 0
    for rec in records:
        assert set(rec) == {"name", "offset", "width", "access", "doc"}, rec
        assert isinstance(rec["offset"], int) and rec["offset"] % 4 == 0, rec
        assert 1 <= rec["width"] <= 32, rec
        assert rec["access"] in ACCESS, rec
        assert rec["doc"].strip(), rec
        if rec["access"] == "counter":
            assert rec["width"] == 32, rec
    names = [r["name"] for r in records]
    offsets = [r["offset"] for r in records]
    assert len(set(names)) == len(names), "duplicate register names"
    assert len(set(offsets)) == len(offsets), "two registers share an offset"
    assert offsets == sorted(offsets), "records are not in address order"


def test_required_registers_present():
    for name in REQUIRED:
        assert name in REGMAP, name
    for name in PKTENGINE_COUNTERS:
        assert REGMAP[f"pktengine.{name}"].access == "counter"
    assert REGMAP["ident.scratch"].access == "rw"
    assert REGMAP["pktengine.config"].access == "ro" and not REGMAP["pktengine.config"].const


def test_ident_block_layout():
    assert REGMAP["ident.id"].offset == 0x00
    assert REGMAP["ident.id"].init == MAGIC == int.from_bytes(b"STLR", "big")
    assert REGMAP["ident.version"].offset == 0x04
    assert REGMAP["ident.version"].init == 0x000100  # 0.1.0
    assert decode_version(REGMAP["ident.version"].init) == regmap.VERSION == (0, 1, 0)
    assert REGMAP["ident.scratch"].offset == 0x08
    assert REGMAP["ident.feature_count"].offset == 0x0C
    for name in ("ident.id", "ident.version", "ident.feature_count", "ident.feature0"):
        assert REGMAP[name].access == "ro" and REGMAP[name].const, name


def _driver_discovery(read32):
    """What a driver does: check the magic, then walk the feature list."""
    assert read32(0x00) == MAGIC
    found = []
    for i in range(read32(0x0C)):
        found.append(decode_feature(read32(0x10 + 4 * i)))
    return found


def test_feature_discovery_finds_every_block():
    def read32(offset):
        reg = REGMAP.at(offset)
        assert reg is not None and reg.const, f"driver read a non-constant at {offset:#x}"
        return reg.init

    found = _driver_discovery(read32)
    expected = [(b.feature, b.version, b.base) for b in REGMAP.blocks if b.feature is not None]
    assert found == expected
    assert (FEATURE_PKTENGINE, 1, 0x0100) in found
    assert REGMAP.block("pktengine").base == 0x0100


def test_lookup():
    rx = REGMAP["pktengine.rx_frames"]
    assert rx.offset == 0x0100 + REGMAP.block("pktengine").register("rx_frames").offset
    assert REGMAP.at(rx.offset) is rx
    assert REGMAP.at(0x0FFC) is None
    assert [m.name for m in REGMAP] == [r["name"] for r in _records()]
    with pytest.raises(KeyError):
        REGMAP["pktengine.no_such_register"]
    with pytest.raises(KeyError):
        REGMAP.block("nonexistent")
    # Every register lies inside its block, and every block inside the map's span.
    for b in REGMAP.blocks:
        for r in b.registers:
            assert b.base <= REGMAP[f"{b.name}.{r.name}"].offset < b.base + b.size
    assert REGMAP.span <= 1 << 16


def test_feature_word_round_trip():
    for feature, version, base in [(1, 1, 0x100), (255, 0, 0), (7, 255, 0xFFFF00)]:
        assert decode_feature(encode_feature(feature, version, base)) == (feature, version, base)
    assert encode_feature(1, 1, 0x100) == 0x01010001
    with pytest.raises(ValueError):
        encode_feature(0, 1, 0x100)  # id 0 reserved
    with pytest.raises(ValueError):
        encode_feature(1, 1, 0x180)  # not block aligned
    with pytest.raises(ValueError):
        encode_feature(1, 256, 0x100)
    assert encode_version(1, 2, 3) == 0x010203
    with pytest.raises(ValueError):
        encode_version(256, 0, 0)


def _reg(name="r", offset=0, width=32, access="rw", **kw):
    return Register(name, offset, width, access, f"doc of {name}", **kw)


@pytest.mark.parametrize("kwargs", [
    dict(offset=2),                              # misaligned
    dict(width=0),
    dict(width=33),
    dict(access="wx"),                           # not an access kind
    dict(width=8, init=0x100),                   # init does not fit
    dict(access="counter", width=16),            # counters are 32 bits
    dict(access="clear", width=32),
    dict(access="rw", const=True),               # only ro can be constant
    dict(name="Bad"),
    dict(name="a__b"),
])
def test_register_rejects(kwargs):
    with pytest.raises(ValueError):
        _reg(**kwargs)


def test_register_needs_doc():
    with pytest.raises(ValueError):
        Register("r", 0, 32, "rw", "  ")


def test_block_rejects():
    with pytest.raises(ValueError, match="duplicate"):
        Block("b", 0x100, 1, "d", [_reg("a", 0), _reg("a", 4)], feature=9)
    with pytest.raises(ValueError, match="already used"):
        Block("b", 0x100, 1, "d", [_reg("a", 0), _reg("c", 0)], feature=9)
    with pytest.raises(ValueError, match="outside"):
        Block("b", 0x100, 1, "d", [_reg("a", BLOCK_SIZE)], feature=9)
    with pytest.raises(ValueError, match="multiples"):
        Block("b", 0x180, 1, "d", [_reg("a")], feature=9)
    with pytest.raises(ValueError, match="clashes"):
        Block("b", 0x100, 1, "d", [_reg("hits", 0, access="counter"), _reg("hits_inc", 4)], feature=9)
    with pytest.raises(ValueError):
        Block("s_axil", 0x100, 1, "d", [_reg("a")], feature=9)


def test_registermap_rejects():
    a = Block("a", 0x100, 1, "d", [_reg("x")], feature=9)
    with pytest.raises(ValueError, match="overlaps"):
        RegisterMap([a, Block("b", 0x100, 1, "d", [_reg("y")], feature=9)])
    with pytest.raises(ValueError, match="overlaps"):
        RegisterMap([Block("b", 0x000, 1, "d", [_reg("y")], feature=9)])  # on top of ident
    with pytest.raises(ValueError, match="duplicate block"):
        RegisterMap([a, Block("a", 0x200, 1, "d", [_reg("y")], feature=9)])
    with pytest.raises(ValueError, match="feature id"):
        RegisterMap([Block("c", 0x200, 1, "d", [_reg("y")])])


def test_registermap_builds_feature_list_for_new_blocks():
    # What a later issue does: append a block; ident grows a feature word for it.
    extra = Block("flowtable", 0x0F00, 3, "flow table", [_reg("size", 0, access="ro")], feature=42)
    m = RegisterMap([*regmap.BLOCKS, extra])
    assert m["ident.feature_count"].init == len(regmap.BLOCKS) + 1
    words = [decode_feature(m[f"ident.feature{i}"].init) for i in range(m["ident.feature_count"].init)]
    assert (42, 3, 0x0F00) in words
    assert [w[2] for w in words] == sorted(w[2] for w in words)
    assert m["flowtable.size"].offset == 0x0F00


def test_cli_json_matches_map():
    out = _cli("--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == _records()


def test_cli_markdown_lists_every_register():
    out = _cli("--markdown")
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| 0x")]
    assert len(rows) == len(REGMAP)
    for m in REGMAP:
        assert f"| {m.offset:#06x} | {m.name} |" in out.stdout, m.name


def test_cli_requires_a_format():
    assert _cli().returncode != 0


def test_regmap_does_not_import_amaranth():
    # The host driver imports this module and must not pull in the HDL toolchain.
    code = ("import sys, stellar.hdl.regmap; "
            "bad = [m for m in sys.modules if m.split('.')[0] == 'amaranth']; "
            "assert not bad, bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
