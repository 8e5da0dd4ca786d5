"""``ferryman``: the operator's command line (one Typer app, one module per command group).

Groups register themselves on ``app`` in ``_app``; ``main`` runs it with
Ferryman's exit-code contract (``EXIT_*`` in ``_common``): 0 success, 1 a finding
(an audit violation), 2 bad usage or configuration (or a value the server
refused), 3 the command could not do its work, 4 the server does not answer,
5 it refuses the credentials, 6 the token's role may not make the call, 7 what
the command names does not exist, 8 the TLS handshake failed, 9 the server
refused the request in its current state, 10 what it would create exists
already, 11 a concurrent change won (stale etag). Every failure is one line on
stderr, never a traceback.
"""

import os

# gRPC's C core logs handshake failures and the like straight to stderr; the CLI
# reports each failure once, as its own line. Set before gRPC is first imported.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

from ferryman.cli._app import app, main

__all__ = ["app", "main"]
