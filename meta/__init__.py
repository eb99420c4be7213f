"""The meta node: the replicated log's commands and events, the pure state machine, the Raft adapter, the HTTP API."""
