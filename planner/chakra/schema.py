"""Chakra's execution-trace schema (``ChakraProtoMsg``, version 0.0.4), built here.

The messages, fields and numbers are those of Chakra's ``et_def.proto`` (mlcommons/chakra@21585d8
``schema/protobuf/et_def.proto``; byte-identical at astra-sim/chakra@f37c2bb, the Chakra that
ASTRA-sim 518bd513 reads traces with, and in STAGE). They are written out below as a protobuf
``FileDescriptorProto`` and loaded into a private descriptor pool, so no ``protoc`` step and no
generated ``_pb2`` module are needed: the ``protobuf`` runtime builds the message classes.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["COLLECTIVE_TYPES", "NODE_TYPES", "PACKAGE", "message_class"]

PACKAGE = "ChakraProtoMsg"

NODE_TYPES = ("INVALID_NODE", "METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "COMP_NODE",
              "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE")
"""``enum NodeType``, numbered 0, 1, ... in this order."""
COLLECTIVE_TYPES = ("ALL_REDUCE", "REDUCE", "ALL_GATHER", "GATHER", "SCATTER", "BROADCAST",
                    "ALL_TO_ALL", "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "BARRIER")
"""``enum CollectiveCommType``, numbered 0, 1, ... in this order."""

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = (  # the value types of AttributeProto, in field-number order (value, then its list)
    ("double", _F.TYPE_DOUBLE, "Double"), ("float", _F.TYPE_FLOAT, "Float"),
    ("int32", _F.TYPE_INT32, "Int32"), ("int64", _F.TYPE_INT64, "Int64"),
    ("uint32", _F.TYPE_UINT32, "Uint32"), ("uint64", _F.TYPE_UINT64, "Uint64"),
    ("sint32", _F.TYPE_SINT32, "Sint32"), ("sint64", _F.TYPE_SINT64, "Sint64"),
    ("fixed32", _F.TYPE_FIXED32, "Fixed32"), ("fixed64", _F.TYPE_FIXED64, "Fixed64"),
    ("sfixed32", _F.TYPE_SFIXED32, "Sfixed32"), ("sfixed64", _F.TYPE_SFIXED64, "Sfixed64"),
    ("bool", _F.TYPE_BOOL, "Bool"), ("string", _F.TYPE_STRING, "String"),
    ("bytes", _F.TYPE_BYTES, "Bytes"),
)


def _field(msg: Any, name: str, number: int, kind: int, *, repeated: bool = False,
           type_name: str | None = None, oneof: int | None = None) -> None:
    f = msg.field.add(name=name, number=number, type=kind,
                      label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if type_name is not None:
        f.type_name = f".{PACKAGE}.{type_name}"
    if oneof is not None:
        f.oneof_index = oneof


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="parallel_planner/chakra_et_def.proto",
                                            package=PACKAGE, syntax="proto3")
    attr = fd.message_type.add(name="AttributeProto")
    _field(attr, "name", 1, _F.TYPE_STRING)
    _field(attr, "doc_string", 2, _F.TYPE_STRING)
    attr.oneof_decl.add(name="value")
    for i, (scalar, kind, title) in enumerate(_SCALARS):
        _field(attr, f"{scalar}_val", 3 + 2 * i, kind, oneof=0)
        _field(attr, f"{scalar}_list", 4 + 2 * i, _F.TYPE_MESSAGE, type_name=f"{title}List",
               oneof=0)
        _field(fd.message_type.add(name=f"{title}List"), "values", 1, kind, repeated=True)
    meta = fd.message_type.add(name="GlobalMetadata")
    _field(meta, "version", 1, _F.TYPE_STRING)
    _field(meta, "attr", 2, _F.TYPE_MESSAGE, repeated=True, type_name="AttributeProto")
    for name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COLLECTIVE_TYPES)):
        enum = fd.enum_type.add(name=name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    node = fd.message_type.add(name="Node")
    _field(node, "id", 1, _F.TYPE_UINT64)
    _field(node, "name", 2, _F.TYPE_STRING)
    _field(node, "type", 3, _F.TYPE_ENUM, type_name="NodeType")
    _field(node, "ctrl_deps", 4, _F.TYPE_UINT64, repeated=True)
    _field(node, "data_deps", 5, _F.TYPE_UINT64, repeated=True)
    _field(node, "start_time_micros", 6, _F.TYPE_UINT64)
    _field(node, "duration_micros", 7, _F.TYPE_UINT64)
    _field(node, "inputs", 8, _F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "outputs", 9, _F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "attr", 10, _F.TYPE_MESSAGE, repeated=True, type_name="AttributeProto")
    io = fd.message_type.add(name="IOInfo")
    for number, name in enumerate(("values", "shapes", "types"), start=1):
        _field(io, name, number, _F.TYPE_STRING)
    tensor = fd.message_type.add(name="Tensor")
    for number, name in enumerate(("tensor_id", "storage_id", "offset", "num_elem",
                                   "elem_bytes"), start=1):
        _field(tensor, name, number, _F.TYPE_UINT64)
    _field(tensor, "device", 6, _F.TYPE_STRING)
    return fd


@cache
def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    return pool


@cache
def message_class(name: str) -> Any:
    """The message class ``ChakraProtoMsg.<name>`` (``Node``, ``GlobalMetadata``,
    ``AttributeProto``, ...)."""
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(f"{PACKAGE}.{name}"))
