"""DescribeConfigs, answered by the broker from its own config and its metadata image, as
Kafka 4.2's ``ConfigHelper.describeConfigs`` answers it.

A topic's configs are every topic-level key (``config.CONFIG_DEFS``), each with its value and
where the value comes from (Kafka's ``DescribeConfigsResponse.ConfigSource``): the topic's
own override (TOPIC_CONFIG), else the broker's ``--config`` (STATIC_BROKER_CONFIG), else
the default (DEFAULT_CONFIG). Its synonyms, when asked, are those layers in that order, each
that is set (Kafka's ``createTopicConfigEntry``); minibroker names a key the same at the
topic and the broker level, where Kafka names some differently (``segment.bytes`` and
``log.segment.bytes``). A broker's configs (resource name: its id) are every key, read-only
(minibroker's broker configs are static); the empty name asks for the cluster-wide dynamic
defaults, of which minibroker has none. Other resource types are INVALID_REQUEST.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from kio.static.protocol import ResponsePayload

from minibroker.cluster.types import ErrorCode, MetadataImage
from minibroker.config import CONFIG_DEFS, ConfigDef
from minibroker.network.codec import ApiKey, Request
from minibroker.network.responses import NO_THROTTLE, build, response_module

__all__ = ["ConfigApis", "ConfigBroker"]

TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4  # Kafka's ConfigResource.Type
# Kafka's DescribeConfigsResponse.ConfigSource
TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
# Kafka's DescribeConfigsResponse.ConfigType
_BOOLEAN, _STRING, _INT, _LONG = 1, 2, 3, 5
_INT_MAX = 2**31 - 1


class ConfigBroker(Protocol):
    """What ConfigApis needs of the broker: its id, config and metadata image."""

    broker_id: int

    def metadata_image(self) -> MetadataImage: ...

    def broker_config(self) -> dict[str, str]: ...


def _as_string(value: Any) -> str | None:
    """A default as Kafka's ``ConfigDef.convertToString`` writes it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items())
    return str(value)


def _config_type(definition: ConfigDef) -> int:
    """Kafka's ConfigType, from the default's Python type: minibroker's ConfigDef has no
    type of its own. Durations (``*.ms``) and values past an int are LONG, as in Kafka."""
    default = definition.default
    if isinstance(default, bool):
        return _BOOLEAN
    if definition.name.endswith(".ms") or (isinstance(default, int) and default > _INT_MAX):
        return _LONG
    if isinstance(default, int) or default is None:
        return _INT
    return _STRING


def _invalid_topic_name(name: str) -> str | None:
    """Kafka's ``Topic.validate``: why ``name`` cannot be a topic's, or None."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return "Topic name cannot be \".\" or \"..\""
    if len(name) > 249:
        return f"Topic name is illegal, it can't be longer than 249 characters, topic name: " \
               f"{name}"
    if not all(c.isascii() and (c.isalnum() or c in "._-") for c in name):
        return f"Topic name \"{name}\" is illegal, it contains a character other than ASCII " \
               f"alphanumerics, '.', '_' and '-'"
    return None


class ConfigApis:
    """The handler of DescribeConfigs, for ``KafkaApis``."""

    def __init__(self, broker: ConfigBroker) -> None:
        self._broker = broker

    async def handle_describe_configs(self, request: Request) -> ResponsePayload:
        body = request.body
        m = response_module(ApiKey.DESCRIBE_CONFIGS, request.api_version)
        results = []
        for resource in body.resources:
            error, message, configs = self._describe(m, resource, body.include_synonyms,
                                                     getattr(body, "include_documentation",
                                                             False))
            results.append(build(m.DescribeConfigsResult, error_code=error,
                                 error_message=message, resource_type=resource.resource_type,
                                 resource_name=resource.resource_name, configs=configs))
        return build(m.DescribeConfigsResponse, throttle_time=NO_THROTTLE,
                     results=tuple(results))

    def _describe(self, m: Any, resource: Any, synonyms: bool, documentation: bool
                  ) -> tuple[ErrorCode, str | None, tuple[Any, ...]]:
        name, keys = resource.resource_name, resource.configuration_keys
        broker_config = self._broker.broker_config()
        if resource.resource_type == TOPIC_RESOURCE:
            if (why := _invalid_topic_name(name)) is not None:
                return ErrorCode.invalid_topic_exception, why, ()
            topic = self._broker.metadata_image().topics.get(name)
            if topic is None:
                return ErrorCode.unknown_topic_or_partition, None, ()
            layers = ((TOPIC_CONFIG, topic.config), (STATIC_BROKER_CONFIG, broker_config))
            definitions = [d for d in CONFIG_DEFS.values() if d.topic_level]
            read_only = False
        elif resource.resource_type == BROKER_RESOURCE:
            if name == "":
                return ErrorCode.none, None, ()  # no dynamic cluster-wide defaults
            if name != str(self._broker.broker_id):
                return (ErrorCode.invalid_request, f"Unexpected broker id, expected "
                        f"{self._broker.broker_id} or empty string, but received {name}", ())
            layers = ((STATIC_BROKER_CONFIG, broker_config),)
            definitions = list(CONFIG_DEFS.values())
            read_only = True
        else:
            return (ErrorCode.invalid_request,
                    f"Unsupported resource type: {resource.resource_type}", ())
        wanted = None if keys is None else set(keys)
        return ErrorCode.none, None, tuple(
            self._entry(m, d, layers, read_only, synonyms, documentation)
            for d in definitions if wanted is None or d.name in wanted)

    @staticmethod
    def _entry(m: Any, definition: ConfigDef,
               layers: tuple[tuple[int, Mapping[str, str]], ...], read_only: bool,
               synonyms: bool, documentation: bool) -> Any:
        """One config, as Kafka's ``createTopicConfigEntry``/``createBrokerConfigEntry``:
        its source is that of its first synonym."""
        found = [(source, layer[definition.name]) for source, layer in layers
                 if definition.name in layer]
        if definition.default is not None:
            found.append((DEFAULT_CONFIG, _as_string(definition.default)))
        source, value = found[0] if found else (DEFAULT_CONFIG, None)
        return build(
            m.DescribeConfigsResourceResult, name=definition.name, value=value,
            read_only=read_only, config_source=source, is_sensitive=False,
            synonyms=tuple(m.DescribeConfigsSynonym(name=definition.name, value=v, source=s)
                           for s, v in found) if synonyms else (),
            config_type=_config_type(definition),
            documentation=definition.doc if documentation else None)
