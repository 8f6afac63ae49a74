"""One CUDA graph per generate call for the lean decode step (``rollout.engines.hf.cuda_graph``).

On a GPU an eager decode step of a mid-sized model is bound by kernel launches, not arithmetic: a
0.37 B Qwen2 (24 layers) issues ~1,000 small kernels per token (~40 per layer), each a few
microseconds of Python and driver work, while the step's bytes (its weights once) move in a
fraction of that. Capturing the fixed-shape lean step (``hf_lean.LeanStep(fixed_shape=True)``) once
per generate call and replaying it each step removes that cost: 64 x 256 tokens in 1.0 s instead of
5.3 s on an H100 (docs/benchmarks.md, "GPU"). The sampler stays eager (a handful of kernels on
[rows, V]).

The graph reads its inputs from two static buffers (the step's tokens and the slot j) and writes
its logits to one static output, overwritten by the next replay: the decode loop reads each step's
logits before it asks for the next.
"""

from __future__ import annotations

import torch

WARMUP_CALLS = 2  # eager calls on a side stream before capture (cuBLAS handles, workspaces, allocator)


class GraphedStep:
    """``step(tokens [rows], j: int) -> logits [rows, V]`` by replaying one captured graph of
    ``fixed_step(tokens, j as a 0-dim device tensor)``; captured at the first call."""

    def __init__(self, fixed_step, rows: int, device: torch.device):
        if torch.device(device).type != "cuda":
            raise ValueError(
                f"rollout.engines.hf.cuda_graph=true needs the model on a CUDA device, not {device}"
            )
        self.fixed_step = fixed_step
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.j = torch.zeros((), dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def __call__(self, tokens: torch.Tensor, j: int) -> torch.Tensor:
        self.tokens.copy_(tokens)
        self.j.fill_(j)
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.logits

    def _capture(self) -> None:
        # the warm-up calls run the step for real on the current inputs: they write slot j of the
        # rows' own keys / values with the values the first replay writes again
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.fixed_step(self.tokens, self.j)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.fixed_step(self.tokens, self.j)
