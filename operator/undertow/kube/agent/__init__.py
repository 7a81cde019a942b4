"""The fault agent: a sidecar in every broker and controller pod that pauses or kills the
broker and cuts its links, and heals all three on its own when their deadline passes.

It shares the pod's process namespace (``shareProcessNamespace: true``), so it can signal
the broker: the one process whose pid and start time the broker container's launcher
recorded in a file both containers mount (``processes.py``; never whatever else in the pod
mentions ``minibroker``). It stops it with SIGSTOP (SIGCONT resumes it) and kills it with
SIGKILL in place, or with a grace period SIGTERM first and SIGKILL after it (its
container restarts, held down until released: ``hold.py``); it
shares the pod's network namespace, so its iptables rules drop exactly this pod's packets whatever
the CNI. Rules live in chains of its own (``UNDERTOW-INPUT``, ``UNDERTOW-OUTPUT``) jumped
to from INPUT and OUTPUT, so healing is a flush and nothing else in the pod is touched.

Every fault carries a deadline: when it passes, the agent removes the rule or resumes the
process itself, even if the runner and the operator are gone; a heal that fails, for any
reason, is retried until it succeeds. A restarted agent has forgotten its deadlines, so it
heals everything as it starts.

No client can tie the agent up: its server (``minibroker.control_http``) has a fixed
number of threads, a deadline on every request and a bound on every body, and answers a
malformed one with a 400 naming the problem; every iptables call has a timeout.

HTTP API (JSON; bearer token from ``$UNDERTOW_AGENT_TOKEN`` on everything but /healthz)::

    GET    /healthz
    GET    /v1/faults                -> {"faults": [...], "paused": bool, "running": bool}
    POST   /v1/pause   {"deadline_s": 10}       SIGSTOP the target; returns once stopped
    POST   /v1/resume                           SIGCONT the target
    POST   /v1/kill    {"deadline_s": 10}       SIGKILL the target; held down until release
                       optional "grace_s": 5    SIGTERM first, SIGKILL 5 s later (0-300 s)
    POST   /v1/hold    {"deadline_s": 10}       hold the target's next start until release
    POST   /v1/release                          let a killed (or held) target start again
    PUT    /v1/drops/{input|output}/{ip}  {"deadline_s": 10}
    DELETE /v1/drops/{input|output}/{ip}
    PUT    /v1/delays/{input|output}/{ip} {"deadline_s": 10, "latency_s": 0.2,
                                           "jitter_s": 0.05, "correlation": 0.25}
    DELETE /v1/delays/{input|output}/{ip}
    DELETE /v1/delays                           take every delay off, whoever asked for it
    DELETE /v1/drops                            remove every rule (drops and delays)

These are the Kubernetes platform's primitives; the fault kinds compose them
(``undertow.faults``), and so does healing a cluster (``undertow.faults.heal``).

``input`` drops packets from the peer (INPUT -s), ``output`` packets to it (OUTPUT -d).

One module per job: ``processes`` (signals to the recorded broker), ``hold`` (a killed
broker kept down), ``netfilter`` (the DROP and NFQUEUE rules), ``delays`` (the delayers of
delayed links) and ``iptables_backend`` (which iptables writes them), ``fault_agent`` (each
fault applied and healed through those), ``deadlines`` (healing at the deadline),
``server`` (the HTTP API), ``client`` (the caller's side of it, over
``undertow.platform.control``) and ``__main__`` (the sidecar's command line).
"""

from undertow.kube.agent.client import AgentClient
from undertow.kube.agent.deadlines import Fault
from undertow.kube.agent.errors import AgentError
from undertow.kube.agent.fault_agent import FaultAgent
from undertow.kube.agent.hold import Hold
from undertow.kube.agent.iptables_backend import iptables_command
from undertow.kube.agent.netfilter import Netfilter
from undertow.kube.agent.processes import Processes
from undertow.kube.agent.server import make_server

__all__ = ["AgentClient", "AgentError", "Fault", "FaultAgent", "Hold", "Netfilter",
           "Processes", "iptables_command", "make_server"]
