"""``sglang-pcie check-drafter``: catch a broken EAGLE-3 drafter before a long server start.

Reads ``config.json``, safetensors headers and a few small tensors of the drafter (and of the target / a reference
drafter when given): no GPU, no torch, no weight load. The package's seams:

- ``checkpoint``: model folders (a Hugging Face cache entry too), configs, headers, single tensors;
- ``sglang_facts``: what the SGLang in use says (its EAGLE-3 loaders, the target's capture rule), read through
  SourceTree without importing it;
- ``model_checks``, ``layer_ids``, ``vocab``: the checks, each a function of the Context returning a Check;
- ``command``: the checks in order, the report, the command.
"""
from sglang_pcie.tools.check_drafter.command import COMMAND, run_checks

__all__ = ["COMMAND", "run_checks"]
