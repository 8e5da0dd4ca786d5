"""Version of the wrapper/deduper control protocol (``ferryman.v1.ControlService``).

Peers with the same major talk; a newer minor only adds fields or messages
that an older peer ignores (protobuf skips unknown fields). A major mismatch
ends the stream with FAILED_PRECONDITION naming both versions.
"""

from __future__ import annotations

from ferryman.v1 import control_pb2

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 1


def current_version() -> control_pb2.ProtocolVersion:
    """This build's protocol version."""
    return control_pb2.ProtocolVersion(major=PROTOCOL_MAJOR, minor=PROTOCOL_MINOR)


def compatible(peer: control_pb2.ProtocolVersion) -> bool:
    """True when a peer speaking version peer can talk to us."""
    return peer.major == PROTOCOL_MAJOR


def describe(version: control_pb2.ProtocolVersion) -> str:
    """``major.minor``."""
    return f"{version.major}.{version.minor}"
