"""The tools wing: the ``sglang-pcie`` commands. Never imported inside a server process."""
