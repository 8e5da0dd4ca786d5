"""Which role each RPC needs: the one rule, decided from the method's full name.

The rule goes by naming convention, so an RPC added later (a new service included) is
covered without touching this module:

* ``ferryman.v1.ControlService`` (the wrapper-deduper link) needs ``peer``. Only the
  services' own credential (``rpc.auth_token``) and tokens given the ``peer`` role hold
  it: an operator's token, even an admin's, cannot pose as a wrapper, feed the deduper
  progress or ask it for resends.
* A read (the method name starts with one of `READ_PREFIXES`: ``GetDeduperStatus``,
  ``ListFlows``, ``WatchFlows``, ``TranslateOffsets``...) needs ``read-only``.
* Anything else (create, update, delete, pause, run...) needs ``admin``: the safe default.

``admin`` includes ``read-only``; ``peer`` includes nothing else. Health checking and
server reflection stay open to every caller (`OPEN_METHOD_PREFIXES`).
"""

from __future__ import annotations

from collections.abc import Mapping

from ferryman.config import TokenRole

READ_ONLY: TokenRole = "read-only"
ADMIN: TokenRole = "admin"
PEER: TokenRole = "peer"

#: Methods open without a token: orchestrators probe health and tools discover
#: the API without holding the secret; neither reveals replicated data or state.
OPEN_METHOD_PREFIXES: tuple[str, ...] = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)

#: Method-name prefixes of RPCs that change nothing (a read-only token may call them).
READ_PREFIXES: tuple[str, ...] = ("Get", "List", "Watch", "Translate", "Describe")

#: Services that carry the wrapper-deduper link, not operator calls.
PEER_SERVICES: frozenset[str] = frozenset({"ferryman.v1.ControlService"})

#: What each role may call, by the role an RPC needs.
GRANTS: Mapping[TokenRole, frozenset[TokenRole]] = {
    READ_ONLY: frozenset({READ_ONLY}),
    ADMIN: frozenset({READ_ONLY, ADMIN}),
    PEER: frozenset({PEER}),
}

#: What the process's own ``rpc.auth_token`` grants: every role (kept from the single-token days).
ALL_ROLES: frozenset[TokenRole] = frozenset({READ_ONLY, ADMIN, PEER})


def is_open(method: str) -> bool:
    """True for methods every caller may use without a token (health, reflection)."""
    return method.startswith(OPEN_METHOD_PREFIXES)


def required_role(method: str) -> TokenRole:
    """The role a call of method (``/package.Service/Method``) needs; see the module docstring."""
    service, _, name = method.lstrip("/").partition("/")
    if service in PEER_SERVICES:
        return PEER
    if name.startswith(READ_PREFIXES):
        return READ_ONLY
    return ADMIN


def grants(role: TokenRole) -> frozenset[TokenRole]:
    """The roles whose RPCs a token of role may call."""
    return GRANTS[role]
