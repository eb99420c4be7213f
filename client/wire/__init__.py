"""The wire layer: what meta, broker and client agree on byte for byte.

Errors and their codes, JSON bodies with their limits, query parameters, token roles, the error middleware and the
SSE parser live here once, and every service and the client import them from here. It sits in the client package as
Kafka's protocol code sits in its clients module: the servers depend on the client's protocol, never the reverse.
Nothing here imports meta or broker.
"""
