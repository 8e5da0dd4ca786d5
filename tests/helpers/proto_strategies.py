"""Hypothesis strategies of arbitrary protobuf messages, built from their descriptors.

Any message type, present or added later, gets a strategy without code of its own: every
field set or left unset, scalars over their whole range (NaN and infinities included),
enums with unknown numbers too (proto3 enums are open), strings with any code point,
nested messages to a bounded depth, repeated fields and maps.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

#: Nested messages deeper than this are left unset (recursive types, such as Struct, end here).
MAX_DEPTH = 3
#: Items of a repeated or map field.
MAX_ITEMS = 3

_INT32 = st.integers(-(2**31), 2**31 - 1)
_INT64 = st.integers(-(2**63), 2**63 - 1)
_UINT32 = st.integers(0, 2**32 - 1)
_UINT64 = st.integers(0, 2**64 - 1)
_FLOAT = st.floats(width=32, allow_nan=True, allow_infinity=True)
_DOUBLE = st.floats(allow_nan=True, allow_infinity=True)
# Any code point protobuf can carry (no lone surrogates, which are not UTF-8).
_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)

_T = FieldDescriptor
_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    _T.TYPE_INT32: _INT32,
    _T.TYPE_SINT32: _INT32,
    _T.TYPE_SFIXED32: _INT32,
    _T.TYPE_INT64: _INT64,
    _T.TYPE_SINT64: _INT64,
    _T.TYPE_SFIXED64: _INT64,
    _T.TYPE_UINT32: _UINT32,
    _T.TYPE_FIXED32: _UINT32,
    _T.TYPE_UINT64: _UINT64,
    _T.TYPE_FIXED64: _UINT64,
    _T.TYPE_BOOL: st.booleans(),
    _T.TYPE_FLOAT: _FLOAT,
    _T.TYPE_DOUBLE: _DOUBLE,
    _T.TYPE_STRING: _TEXT,
    _T.TYPE_BYTES: st.binary(max_size=64),
}


def load_package(package: Any) -> None:
    """Import every ``*_pb2`` module of package, so that the default pool knows all its types."""
    for module in pkgutil.iter_modules(package.__path__):
        if module.name.endswith("_pb2"):
            importlib.import_module(f"{package.__name__}.{module.name}")


def service(full_name: str) -> ServiceDescriptor:
    """The descriptor of a service the default pool knows."""
    return descriptor_pool.Default().FindServiceByName(full_name)


def message_class(descriptor: Descriptor) -> type[Message]:
    """The generated class of a message type."""
    return message_factory.GetMessageClass(descriptor)


def _message_type(field: FieldDescriptor) -> Descriptor:
    assert field.message_type is not None  # a message-typed field always has one
    return field.message_type


def _value(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any] | None:
    if field.type in {_T.TYPE_MESSAGE, _T.TYPE_GROUP}:
        if depth >= MAX_DEPTH:
            return None
        return messages(_message_type(field), depth + 1)
    if field.type == _T.TYPE_ENUM:
        assert field.enum_type is not None
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), _INT32)
    return _SCALARS[field.type]


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == _T.TYPE_MESSAGE and _message_type(field).GetOptions().map_entry


@st.composite
def _message(draw: st.DrawFn, descriptor: Descriptor, depth: int) -> Message:
    message = message_class(descriptor)()
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue
        if _is_map(field):
            entry = _message_type(field)
            key = _value(entry.fields_by_name["key"], depth)
            value = _value(entry.fields_by_name["value"], depth)
            if key is None or value is None:
                continue
            entries = draw(st.dictionaries(key, value, max_size=MAX_ITEMS))
            target = getattr(message, field.name)
            for k, v in entries.items():
                if entry.fields_by_name["value"].type == _T.TYPE_MESSAGE:
                    target[k].CopyFrom(v)
                else:
                    target[k] = v
            continue
        strategy = _value(field, depth)
        if strategy is None:
            continue
        if field.is_repeated:
            getattr(message, field.name).extend(draw(st.lists(strategy, max_size=MAX_ITEMS)))
        elif field.type == _T.TYPE_MESSAGE:
            getattr(message, field.name).CopyFrom(draw(strategy))
        else:
            setattr(message, field.name, draw(strategy))
    return message


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Arbitrary messages of the type descriptor describes."""
    return _message(descriptor, depth)


def requests(method: MethodDescriptor) -> st.SearchStrategy[Message | list[Message]]:
    """Arbitrary requests of method: one message, or a short list of them for a client-streaming method."""
    one = messages(method.input_type)
    if method.client_streaming:
        return st.lists(one, min_size=0, max_size=4)
    return one
