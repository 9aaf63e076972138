"""The eagle3-profile patch: check.py (static check and diff), payload.py (what runs in SGLang);
docs/eagle3-profile.md."""
