"""``ferryman``: the operator's command line (one Typer app, one module per command group).

Groups register themselves on ``app`` in ``_app``; ``main`` runs it with
Ferryman's exit-code contract: 0 success, 1 a finding (an audit violation),
2 bad usage or configuration (one line on stderr, never a traceback), 3 the
command could not do its work (a cluster unreachable, a read failing), 4 the
gRPC server asked does not answer, 5 it refuses the credentials.
"""

from ferryman.cli._app import app, main

__all__ = ["app", "main"]
