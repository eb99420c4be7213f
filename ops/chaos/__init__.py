"""`stator chaos`: a fault-injection runner in the manner of etcd's robustness tests and Jepsen.

A real cluster (3 meta nodes, 3 brokers) runs behind TCP proxies (proxy.py, topology.py); a seeded nemesis kills,
pauses, restarts and partitions it (nemesis.py) while workloads record every client operation (workloads.py,
history.py); afterwards the history is checked (checker.py). runner.py ties them together.
"""
