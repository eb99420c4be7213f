"""The meta node's HTTP API (API.md, meta section): handlers parse, validate, submit, await, answer."""
