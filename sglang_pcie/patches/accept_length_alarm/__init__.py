"""The accept-length-alarm patch: check.py (static check and diff), payload.py (what runs in SGLang);
docs/accept-length-alarm.md."""
