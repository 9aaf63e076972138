"""The drafter-delegation patch: check.py (static check and diff), payload.py (what runs in SGLang);
docs/drafter-delegation.md."""
