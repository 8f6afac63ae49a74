"""The sampling step inside ``model.generate``: warp the scores ourselves and keep each sampled token's
log-prob as it is drawn, so no teacher-forced pass is needed after generation."""

from __future__ import annotations

import torch

from src.rollout.engines.logprobs import warped_log_probs


class SampledLogProbs:
    """A ``generate`` logits processor that applies temperature and top-p and records log-probs.

    It must be the last processor (``generate`` is called with temperature 1, top_p 1, top_k 0 so
    that Hugging Face adds no warpers after it); the scores it returns are the log-probs of the
    sampling distribution, which ``generate`` then samples from (softmax of log-probs = the same
    distribution). Memory: one [N, V] buffer, not one per step. Token t is only known at the next
    call (or at the end), so each call gathers the previous step's log-prob.
    """

    def __init__(self, temperature: float, top_p: float):
        self.temperature = temperature
        self.top_p = top_p
        self._steps: list[torch.Tensor] = []
        self._pending: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._pending is not None:
            self._steps.append(self._pending.gather(-1, input_ids[:, -1:]).squeeze(-1))
        logp = warped_log_probs(scores, self.temperature, self.top_p)
        self._pending = logp
        return logp

    def log_probs(self, response: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[N, T] response tokens (and mask) -> [N, T] their log-probs, 0 where mask is 0.

        ``generate`` may run steps beyond the returned length and undo them (deferred stop checks):
        only the first T recorded steps are used.
        """
        t = response.shape[1]
        steps = self._steps[:t]
        if len(steps) < t and self._pending is not None:
            steps.append(self._pending.gather(-1, response[:, len(steps) : len(steps) + 1]).squeeze(-1))
        if len(steps) != t:
            raise RuntimeError(f"recorded {len(steps)} sampling steps for {t} generated tokens")
        logp = torch.stack(steps, dim=1) if steps else response.new_zeros(response.shape, dtype=torch.float)
        return torch.where(mask.bool(), logp, torch.zeros_like(logp))
