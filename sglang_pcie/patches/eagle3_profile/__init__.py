"""The eagle3-profile patch: check.py (static check and diff), install.py (which methods are which phase, wrapped
at import), payload.py and its modules (the timers); docs/eagle3-profile.md."""
