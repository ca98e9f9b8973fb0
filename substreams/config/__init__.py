"""The ``substreams.yaml`` configuration: a typed model and a validating loader.

Load once with :func:`load_config`; every invalid input raises
:class:`~substreams.errors.ConfigError` naming the file, line and key.
"""

from substreams.config.loader import load_config, load_config_text
from substreams.config.model import (
    AckerConfig,
    Config,
    ForeignSource,
    KafkaConfig,
    SealPolicy,
    SecurityConfig,
    StageConfig,
    StreamConfig,
    SubstreamConfig,
    TopicSpec,
)

__all__ = [
    "AckerConfig",
    "Config",
    "ForeignSource",
    "KafkaConfig",
    "SealPolicy",
    "SecurityConfig",
    "StageConfig",
    "StreamConfig",
    "SubstreamConfig",
    "TopicSpec",
    "load_config",
    "load_config_text",
]
