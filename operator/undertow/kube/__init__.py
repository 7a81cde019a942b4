"""Kubernetes: the kopf operator for BrokerCluster and ChaosExperiment, the platform the
runner uses in a cluster, and the fault agent that runs beside every broker.

Modules stay importable on their own (the fault agent imports no kopf, the platform no
operator); nothing is imported here.
"""
