"""The sm120-allreduce-fusion patch: check.py (static check and diff), payload.py (what runs in SGLang);
docs/sm120-allreduce-fusion.md."""
