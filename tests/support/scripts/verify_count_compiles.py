"""draft-token-watch's count kernel compiled by this install's Triton for the GPUs the overlay serves on (no GPU
needed: Triton compiles to PTX and cubin with its own ptxas), with the argument types SGLang hands it; prints one
JSON object: arch -> what the compiled code holds."""
import json
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sglang_pcie.patches.draft_token_watch import verify_count

SIGNATURE = {"logits": "*bf16", "row_stride": "i64", "input_ids": "*i64", "seq_lens": "*i64", "counts": "*i64",
             "contexts": "*u8", "per_request": "i32", "VOCAB": "constexpr", "BLOCK": "constexpr",
             "BUCKETS": "constexpr"}
out = {"triton": triton.__version__}
for arch in (80, 90, 100, 120):  # A100, H100 / H200, B200, RTX PRO 6000 Blackwell
    source = ASTSource(fn=verify_count._count_first_drafts, signature=SIGNATURE,
                       constexprs={"VOCAB": 163_840, "BLOCK": verify_count.BLOCK, "BUCKETS": 64})
    kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32))
    ptx = kernel.asm["ptx"]
    out[str(arch)] = {"cubin": len(kernel.asm["cubin"]) > 0,
                      "atomics": sorted(set(re.findall(r"atom\.global\.[a-z_.]*add\.[a-z0-9]+", ptx))),
                      "byte_stores": len(re.findall(r"st\.global\.b8", ptx))}
print(json.dumps(out))
