"""The draft-token-watch patch: check.py (static check and diff), payload.py (what runs in SGLang);
docs/draft-token-watch.md."""
