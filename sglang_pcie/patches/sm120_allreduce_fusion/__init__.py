"""The sm120-allreduce-fusion patch: check.py (static check and diff), payload.py (the helper inserted as text),
swap.py (the install: the shipped diff applied and swapped in); docs/sm120-allreduce-fusion.md."""
