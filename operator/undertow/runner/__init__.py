"""The experiment runner: workload, nemesis, cluster sampling and the history they write."""
