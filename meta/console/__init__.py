"""The web console every meta node serves under /console: pages over the node's own API (pages.py), a queue's
messages and a group's dead letters asked of the brokers (messages.py), the login sessions behind them (sessions.py)
and a topic's mapping timeline (timeline.py)."""
