"""The ground floor of a running node, meta or broker alike: config files, logging, the HTTP server shell (auth,
errors, the connection limit, listeners), and the test-only power-loss ledger. Imports wire/ and nothing else
of ours."""
