"""``python -m undertow.kube``: run the operator (what the operator Deployment runs).

Configuration comes from the environment (``config.OperatorConfig.from_env``); the
operator watches only the namespaces it is told to and runs standalone (one replica, no
peering); cluster-wide, it only lists and watches CRDs and namespaces.
"""

from __future__ import annotations

import logging
import sys

import kopf

from undertow.kube.api import KubeApi
from undertow.kube.config import ConfigError, OperatorConfig
from undertow.kube.handlers import register
from undertow.kube.operator import Operator


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(asctime)s] %(levelname)s %(message)s (%(name)s)")
    try:
        config = OperatorConfig.from_env()
    except ConfigError as exc:
        print(f"undertow operator: {exc}", file=sys.stderr)
        return 2
    registry = kopf.OperatorRegistry()
    register(registry, Operator(KubeApi.from_environment(), config))
    kopf.run(registry=registry, namespaces=list(config.namespaces), standalone=True,
             liveness_endpoint="http://0.0.0.0:8080/healthz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
