"""The node agent: Node protocol and types, resctrl backend, PMC reader, simulator,
gRPC server and client. Owns everything that touches the machine; imports nothing above it."""
