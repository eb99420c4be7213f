"""The data-only broker: physical queue storage, the HTTP data API, the follower of meta's watch stream, pull locks, pop state."""
