"""Authenticated clusters: a SASL/PLAIN listener, named users and KRaft's ``StandardAuthorizer`` (real ACLs).

A cluster started with ``LocalCluster.start(name, sasl=SaslPlain({...}))`` refuses anonymous clients:
every client logs in with a user name and password over ``SASL_PLAINTEXT``, and every request is
checked against the cluster's ACLs (nothing is allowed that no ACL allows). The ``admin`` user is a
super user: the broker and its controller talk to each other as it, the harness's readiness probes
run as it, and tests grant ACLs with its ``client_config()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ferryman_local._errors import HarnessError

STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
"""KRaft's authorizer: ACLs live in the metadata log (``AdminClient.create_acls``)."""

_LISTENER = "SASL_PLAINTEXT"
_PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"


def _quoted(value: str) -> str:
    if '"' in value or "\\" in value or ";" in value:
        raise HarnessError(f"SASL user names and passwords must not hold quotes, backslashes or ';': {value!r}")
    return f'"{value}"'


@dataclass(frozen=True)
class SaslPlain:
    """Users of an authenticated local cluster (SASL/PLAIN over plaintext, ACLs enforced).

    Attributes:
        users: user name to password, for clients under test (no ACLs at first: grant them).
        admin: the super user's name (inter-broker and controller traffic, the harness, ACL grants).
        admin_password: its password.
    """

    users: Mapping[str, str] = field(default_factory=dict)
    admin: str = "admin"
    admin_password: str = "admin-secret"

    def client_config(self, user: str | None = None) -> dict[str, str]:
        """The librdkafka settings that log in as user (default: the super user), without bootstrap servers.

        Raises:
            HarnessError: user is not one of the cluster's users.
        """
        name = user or self.admin
        password = self.admin_password if name == self.admin else self.users.get(name)
        if password is None:
            raise HarnessError(f"no SASL user {name!r} on this cluster (users: {sorted(self.users)})")
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": name,
            "sasl.password": password,
        }

    def principal(self, user: str) -> str:
        """The ACL principal of user (``User:<name>``)."""
        return f"User:{user}"

    def broker_properties(self, port: int, controller_port: int) -> dict[str, str]:
        """The listener, login and authorizer settings of a one-node cluster (they override the plaintext ones).

        The client listener and the controller listener both take SASL/PLAIN logins; the node talks
        to its own controller and to itself as the super user, so no anonymous principal is trusted.
        """
        accounts = {self.admin: self.admin_password, **self.users}
        jaas = " ".join(
            [
                f"{_PLAIN_LOGIN} required",
                f"username={_quoted(self.admin)}",
                f"password={_quoted(self.admin_password)}",
                *(f"user_{name}={_quoted(password)}" for name, password in accounts.items()),
            ]
        )
        return {
            "listeners": f"{_LISTENER}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"{_LISTENER}://127.0.0.1:{port}",
            "listener.security.protocol.map": f"CONTROLLER:{_LISTENER},{_LISTENER}:{_LISTENER}",
            "inter.broker.listener.name": _LISTENER,
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "sasl.mechanism.controller.protocol": "PLAIN",
            f"listener.name.{_LISTENER.lower()}.plain.sasl.jaas.config": f"{jaas};",
            "listener.name.controller.plain.sasl.jaas.config": f"{jaas};",
            "authorizer.class.name": STANDARD_AUTHORIZER,
            "super.users": f"User:{self.admin}",
            "allow.everyone.if.no.acl.found": "false",
        }
