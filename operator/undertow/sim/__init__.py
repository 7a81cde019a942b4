"""Whole experiments in deterministic simulation (``undertow run --platform sim``).

The broker's own ``QuorumController``, ``ReplicaManager``, ``Partition`` and group code run
on one virtual clock (``loop``), their processes (``process``) talk over a virtual network
(``network``) whose links have a latency and can drop packets, and virtual Kafka clients
(``clients``) play the workload. The fault units of ``undertow.faults`` act on it through the
same ``Platform`` primitives (``platform``); ``run`` drives the experiment's phases in virtual
time and writes the one history schema. One seed, one history, byte for byte.
"""
