"""``sglang-pcie bench [options] -- <launch_server arguments>``: the overlay's effect on a real server, side by side.

Each variant runs as its own real server (``python -m sglang.launch_server`` plus the arguments after ``--``), in
a fresh process tree, one at a time. Bench waits for ``/health``, reads ``/model_info``, warms the server up,
drives a fixed deterministic workload (token ids, greedy, ``ignore_eos``: a batch at ``--concurrency`` and a
concurrency-1 stream), then stops the whole tree and waits until no process of it remains. Before the first
measured server, one unmeasured warm-up server of the first run's variant (``--no-warmup`` skips it): the first
server on a fresh machine is cold (JIT builds) and would bias every ratio to it.

Variants: ``baseline`` (``SGLANG_PCIE_DISABLE=1``), ``overlay``, ``profile`` (``EAGLE3_PROFILE=1``, its JSON lines
in the run folder) and user variants ``NAME:FIELD=VALUE[;FIELD=VALUE...]`` with the fields ``env`` (``K=V``
pairs, space-separated), ``args`` (launch arguments appended after the common ones, so they override them),
``base`` (``baseline``, ``overlay`` or ``profile``: what the variant starts from; ``overlay`` by default),
``tokens`` (``must-match`` or ``may-differ``; ``may-differ`` by default when ``args`` is given) and ``repeats``
(K: run only in the last K repeats, e.g. one point of a sweep).

Repeats are interleaved in counterbalanced order (A B C, C B A, A B C, ...); each metric is the median of the
per-repeat ratios to ``baseline`` with the 95% t interval of those pairs, called higher or lower only when the
interval clears the baseline servers' own spread (``verdicts``), and the smallest effect the pairs could resolve.
``--repeats auto`` adds repeats until that smallest effect is under ``--resolve`` or ``--budget-minutes`` ends.
A request that returns fewer tokens than asked fails its run.

Outputs of every run are compared request by request with the first baseline run (servers, not repeats within
one server: prefix-cache hits change kernels inside one server).

Why not SGLang's ``bench_serving``: it builds prompts through a tokenizer (a ``--skip-tokenizer-init`` server has
none), keeps aggregate figures rather than each request's output ids (needed for the token-by-token comparison),
and must import SGLang in the client process. The client here is the standard library's ``http.client``.

The modules, in the order a run uses them: ``plan`` (variants, order, workload, each server's command and
environment), ``client`` (``/generate``, plain and streamed, replies checked), ``runs`` (one server start to stop,
the whole schedule, --repeats auto), ``workload`` (what a ready server is sent and what is measured of it),
``acceptance`` (accept length and histogram from SGLang's meta info), ``analysis`` (ratios, outputs compared, profile invariants,
NCCL, exit status), ``verdicts`` (the interval, the verdict, when auto stops), ``report`` (table, chart, schedule,
results.json), ``command`` (options, the plan they make, ``COMMAND``). Another tool (tune-spec) builds its own
``Plan``, runs with ``Plan.make_run`` and starts them with ``runs.execute_run`` and ``runs.warm_up``.
"""
from sglang_pcie.tools.bench.command import COMMAND

__all__ = ["COMMAND"]
