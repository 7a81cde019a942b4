"""The operator's configuration, from its Deployment's environment (Helm values set it)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from undertow.kube.objects import Images, JobSettings
from undertow.kube.platform import Endpoints


class ConfigError(ValueError):
    """An environment variable the operator cannot use; the message names it."""


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...]
    """Namespaces the operator watches (its Role is bound in each)."""
    images: Images = field(default_factory=Images)
    jobs: JobSettings = field(default_factory=JobSettings)
    endpoints: Endpoints = field(default_factory=Endpoints)
    interval_s: float = 5.0
    """How often each BrokerCluster and ChaosExperiment is looked at again."""
    heal_timeout_s: float = 120.0
    """How long Healing waits for every broker to be ready before analysing anyway."""
    http_timeout_s: float = 2.0
    """Timeout of each call to a pod's fault agent or /v1/state."""
    operator_namespace: str | None = None
    """The operator's own namespace ($POD_NAMESPACE): each cluster's NetworkPolicy admits
    the operator's pods from there (None: from the cluster's namespace)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> OperatorConfig:
        namespaces = tuple(n.strip() for n in env.get("UNDERTOW_NAMESPACES", "").split(",")
                           if n.strip()) or tuple(filter(None, [env.get("POD_NAMESPACE")]))
        if not namespaces:
            raise ConfigError("UNDERTOW_NAMESPACES (or POD_NAMESPACE) must name the "
                              "namespaces to watch")
        defaults_images, defaults_jobs = Images(), JobSettings()
        images = Images(
            operator=env.get("UNDERTOW_OPERATOR_IMAGE", defaults_images.operator),
            analysis=env.get("UNDERTOW_ANALYSIS_IMAGE", defaults_images.analysis),
            broker=env.get("UNDERTOW_BROKER_IMAGE", defaults_images.broker),
            pull_policy=env.get("UNDERTOW_IMAGE_PULL_POLICY", defaults_images.pull_policy))
        jobs = JobSettings(
            history_size=env.get("UNDERTOW_HISTORY_SIZE", defaults_jobs.history_size),
            storage_class=env.get("UNDERTOW_STORAGE_CLASS") or None,
            runner_resources=_json(env, "UNDERTOW_RUNNER_RESOURCES",
                                   defaults_jobs.runner_resources),
            analysis_resources=_json(env, "UNDERTOW_ANALYSIS_RESOURCES",
                                     defaults_jobs.analysis_resources),
            agent_resources=_json(env, "UNDERTOW_AGENT_RESOURCES",
                                  defaults_jobs.agent_resources))
        return cls(namespaces=namespaces, images=images, jobs=jobs,
                   operator_namespace=env.get("POD_NAMESPACE") or None,
                   interval_s=_seconds(env, "UNDERTOW_INTERVAL_S", cls.interval_s),
                   heal_timeout_s=_seconds(env, "UNDERTOW_HEAL_TIMEOUT_S", cls.heal_timeout_s))


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a number of seconds") from None
    if value <= 0:
        raise ConfigError(f"{name}={raw!r}: must be positive")
    return value


def _json(env: Mapping[str, str], name: str, default: Mapping[str, Any]) -> Mapping[str, Any]:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: expected a JSON object like "
                          '{"requests": {"cpu": "100m"}}')
    return value
