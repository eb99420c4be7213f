"""The broker's HTTP data API (API.md, broker section)."""
