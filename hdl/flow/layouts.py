"""Amaranth layouts of the flow-pipeline formats declared in ``stellar.hdl.flow.fields``.

``data.StructLayout`` places its first field in the least significant bits, the same order as
the field tables, so ``FieldTable.pack`` gives the integer value of a view of these layouts.
"""

from amaranth.lib import data

from .fields import FLOW_KEY, MR_ENTRY, QP_CONTEXT

__all__ = ["struct_layout", "qp_context_layout", "mr_entry_layout", "flow_key_layout"]


def struct_layout(table):
    return data.StructLayout({f.name: f.width for f in table})


def qp_context_layout():
    return struct_layout(QP_CONTEXT)


def mr_entry_layout():
    return struct_layout(MR_ENTRY)


def flow_key_layout():
    return struct_layout(FLOW_KEY)
