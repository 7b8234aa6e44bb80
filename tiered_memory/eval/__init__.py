"""Memory-quality evaluation: replays conversations through the daemon's HTTP API and measures how
much of what was said early is still in the context it hands back. Never imported by the daemon."""
