"""The ground floor every part stands on: what crosses the wire between Stator's processes and its clients.

Errors and codes, JSON bodies and their limits, query parameters, headers, SSE, the route shape, names and their
rules, the disk identity of a data directory, TLS contexts, and the one HTTP caller with its backoff. Nothing here
imports meta, broker, client or ops."""
