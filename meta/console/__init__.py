"""The web console every meta node serves under /console: pages over the node's own API (pages.py), the login
sessions behind them (sessions.py) and a topic's mapping timeline (timeline.py)."""
