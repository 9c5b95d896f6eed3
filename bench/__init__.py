"""Benchmarks: ``make bench`` = ``python -m bench.run``.

Times each generated kernel against the unfused PyTorch chain it replaces
(eager and ``torch.compile``), every contender replayed from a CUDA graph with
cold weights, next to the streaming floor (bytes that must move / the copy
bandwidth measured in the same run). ``python -m bench.run --dry-run`` runs
everything but the timing on the CPU (fake numbers, outputs to a temp folder).

Modules: ``run`` (the command line and the run; ``--kernels minimax,deepseek``),
``timing`` (CUDA-graph timing, copy bandwidth, the dry-run stand-in),
``minimax`` (the MiniMax-M3 pre_attn case: inputs, contenders, correctness
guard, bytes), ``deepseek`` (the same for the DeepSeek-V4.1 attn_front at TP4),
``report`` (table, markdown, JSON, plot), ``plot`` (``python -m bench.plot
bench.json``: the plots from a saved run, for machines where matplotlib was
missing or whose bench/ folder is not kept)."""
