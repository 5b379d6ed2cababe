"""The gRPC node agent: any ``Node`` served over the network (``rdtune agent``).

Modules: ``convert`` (agent.types <-> protobuf), ``errors`` (NodeError <-> gRPC status),
``service`` (the NodeAgent and Simulation servicers), ``security`` (token, rate limit,
listen-address rules), ``metrics`` (Prometheus), ``scrape`` (Prometheus histograms of LC
services as a latency source), ``config`` and ``app`` (building and running a server) and
``cli`` (the ``rdtune agent`` subcommand). The client is :mod:`agent.client`.
See docs/ARCHITECTURE.md ("The seams") and docs/AGENT.md.
"""
