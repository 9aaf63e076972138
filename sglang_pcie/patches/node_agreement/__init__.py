"""The node-agreement patch: check.py (static check and diff), payload.py (what runs in SGLang);
docs/node-agreement.md."""
