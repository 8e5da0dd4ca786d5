"""Ferryman contracts: configuration, naming, envelope codec, state, errors.

The services (``ferryman_wrapper``, ``ferryman_deduper``) and the admin client
import these; nothing here depends on either service.
"""

from ferryman.config import (
    ClusterConfig,
    DeduperConfig,
    FerrymanConfig,
    FlowConfig,
    NamingConfig,
    WrapperConfig,
    load_config,
)
from ferryman.errors import (
    AuthorizationError,
    ConfigError,
    CorruptEnvelopeError,
    EnvelopeError,
    FencedError,
    FerrymanError,
    KafkaOperationError,
    SourceDataLostError,
    TopicShapeError,
    UnsupportedEnvelopeError,
)
from ferryman.naming import FlowNames, NamingPolicy, TopicFilter

__all__ = [
    "AuthorizationError",
    "ClusterConfig",
    "ConfigError",
    "CorruptEnvelopeError",
    "DeduperConfig",
    "EnvelopeError",
    "FencedError",
    "FerrymanConfig",
    "FerrymanError",
    "FlowConfig",
    "FlowNames",
    "KafkaOperationError",
    "NamingConfig",
    "NamingPolicy",
    "SourceDataLostError",
    "TopicFilter",
    "TopicShapeError",
    "UnsupportedEnvelopeError",
    "WrapperConfig",
    "load_config",
]
