"""The wrapper service: source records to envelopes in the staging topic."""

from ferryman_wrapper._wrapper import Wrapper

__all__ = ["Wrapper"]
