"""The router head: prompt representation -> small MLP -> 3 logits (ANSWER / SEARCH / CALCULATE).

Smooth-inverse-frequency pooling of a prompt's tokens (``router.pooling: sif``; Arora, Liang & Ma
2017, "A simple but tough-to-beat baseline for sentence embeddings"), as pure functions.

A plain mean of a request's token states is dominated by frequent tokens: word pieces, letters
and punctuation that every template shares. A request phrased unlike any training prompt then
reads as whatever those pieces meant in training (a tiny tokenizer cuts a new word into letters,
and in the embedded benchmark letters are what vague tool requests are made of). SIF weighs each
token by a / (a + p(token)), p its frequency in the training prompts' pooled windows, so the rare,
telling tokens carry the mean, then removes the pooled vectors' common direction (their first
singular vector), which every prompt shares and which carries no label.

A token that never occurs in the training windows has p = 0, so plain SIF gives it the full weight
1, though the router head never read it in training (a tiny tokenizer cuts a held-out phrasing's
new words into such pieces): ``UnseenRule.weight`` sets what it weighs instead. At 0 a prompt pools
over the tokens training gave the head, and a window of unseen tokens only pools to zero.

A new word is not always cut into unseen pieces only: a byte-level BPE cuts " details" into a bare
space marker, which training saw only before numbers, and three pieces it never saw. With
``UnseenRule.unit="word"`` every piece of a word that has an unseen piece weighs ``UnseenRule.weight``, so
the known fragments of a new word do not speak for it. Training prompts have no unseen piece in
their windows, so on them the two units pool the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

N_ROUTES = 3


def prompt_representation(
    hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    pooling: str = "last",
    tail_tokens: int = 32,
    token_weight: torch.Tensor | None = None,
    component: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pool the final hidden states of a prompt batch.

    Args:
        hidden: [B, L, H] final-layer hidden states.
        attention_mask: [B, L] 1 on real tokens (left or right padding both work).
        pooling: "last" (last real token), "mean" (mean over real tokens), "tail" (mean over
            the last ``tail_tokens`` real tokens: the request at the end of a prompt whose long
            system message is mostly the same from prompt to prompt) or "sif" (the tail's mean
            weighted by ``token_weight``, then ``component`` removed: SIF pooling, below).
        token_weight: [B, L] per-position weights ("sif" only).
        component: [H] the unit direction removed from the pooled vectors ("sif" only).
    Returns:
        [B, H]
    """
    mask = attention_mask.to(hidden.dtype)
    if pooling == "sif":
        if token_weight is None or component is None:
            raise ValueError("router.pooling='sif' needs the token weights and the common component")
        weight = tail_mask(attention_mask, tail_tokens).to(hidden.dtype) * token_weight.to(hidden.dtype)
        pooled = (hidden * weight.unsqueeze(-1)).sum(1) / weight.sum(1, keepdim=True).clamp(min=1e-12)
        return remove_component(pooled, component)
    if pooling == "tail":
        mask = tail_mask(attention_mask, tail_tokens).to(hidden.dtype)
        pooling = "mean"
    if pooling == "mean":
        return (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
    if pooling == "last":
        positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        last = torch.where(attention_mask.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last.clamp(min=0)]
    raise ValueError(f"router.pooling={pooling!r}; expected 'last', 'mean', 'tail' or 'sif'")


@dataclass
class RouterOutput:
    router_logits: torch.Tensor  # [B, 3]
    router_action: torch.Tensor  # [B] long
    router_log_prob: torch.Tensor  # [B]


@dataclass(frozen=True)
class UnseenRule:
    """SIF pooling of what the training windows never held: a token absent from them weighs
    ``weight``; with ``unit="word"`` so does every other piece of its word."""

    weight: float = 1.0
    unit: str = "token"


class RouterHead(nn.Module):
    """MLP over the pooled prompt representation.

    With ``pooling="sif"`` the head also holds the SIF statistics as buffers (checkpointed with
    it): ``sif_weight`` [vocab_size] per-token weights and ``sif_component`` [hidden_size] the
    removed direction, fitted on the training prompts before the first step (``set_sif``; until
    then weights 1 and no component: the plain tail mean).

    With ``base_embeddings`` it holds ``base_embedding`` [vocab_size, hidden_size], a frozen copy of
    the base model's input embedding table (``set_base_embedding``, checkpointed with the head), and
    ``embed`` reads the prompt's tokens from it instead of the actor's hidden states.

    With ``unseen.unit == "word"`` (SIF only) it also holds ``sif_seen`` [vocab_size] (the token occurs
    in the training windows) and ``sif_word_start`` [vocab_size] (the token begins a word), set with
    the weights; until then every token is seen and its own word: the per-token weights as they are."""

    def __init__(
        self,
        hidden_size: int,
        mlp_hidden: int = 64,
        pooling: str = "last",
        tail_tokens: int = 32,
        vocab_size: int | None = None,
        base_embeddings: bool = False,
        unseen: UnseenRule = UnseenRule(),
    ):
        super().__init__()
        self.pooling, self.tail_tokens, self.unseen = pooling, tail_tokens, unseen
        if unseen.unit not in ("token", "word"):
            raise ValueError(f"router.sif_unseen_unit={unseen.unit!r}; expected 'token' or 'word'")
        self.mlp = nn.Sequential(
            nn.LayerNorm(hidden_size),
            nn.Linear(hidden_size, mlp_hidden),
            nn.GELU(),
            nn.Dropout(0.0),  # no dropout; the slot keeps the MLP's checkpoint keys ("4.weight")
            nn.Linear(mlp_hidden, N_ROUTES),
        )
        if pooling == "sif":
            if vocab_size is None:
                raise ValueError("router.pooling='sif' needs the backbone's vocab_size")
            self.register_buffer("sif_weight", torch.ones(vocab_size))
            self.register_buffer("sif_component", torch.zeros(hidden_size))
            if unseen.unit == "word":
                self.register_buffer("sif_seen", torch.ones(vocab_size, dtype=torch.bool))
                self.register_buffer("sif_word_start", torch.ones(vocab_size, dtype=torch.bool))
        if base_embeddings:
            if vocab_size is None:
                raise ValueError("router.input='base_embeddings' needs the backbone's vocab_size")
            self.register_buffer("base_embedding", torch.zeros(vocab_size, hidden_size))

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, prompt_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """hidden [B, L, H], attention_mask [B, L] (prompt_ids [B, L] for "sif") -> logits [B, 3]."""
        return self.mlp(self.represent(hidden, attention_mask, prompt_ids).to(self.mlp[1].weight.dtype))

    def mlp_with(self, weights: dict[str, torch.Tensor], pooled: torch.Tensor) -> torch.Tensor:
        """``self.mlp``'s function with other weights (keys as ``self.mlp.named_parameters()``):
        pooled [B, H] -> logits [B, 3]. Plain functional ops, no module call: sharding hooks (ZeRO-3,
        FSDP2) act on module calls and would fetch the live weights."""
        norm, _, act, drop, _ = self.mlp
        x = pooled.to(weights["1.weight"].dtype)
        x = F.layer_norm(x, norm.normalized_shape, weights["0.weight"], weights["0.bias"], norm.eps)
        x = F.gelu(F.linear(x, weights["1.weight"], weights["1.bias"]), approximate=act.approximate)
        x = F.dropout(x, drop.p, self.training)
        return F.linear(x, weights["4.weight"], weights["4.bias"])

    def represent(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, prompt_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The MLP's input [B, H]: the prompt's pooled hidden states."""
        if self.pooling != "sif":
            return prompt_representation(hidden, attention_mask, self.pooling, self.tail_tokens)
        if prompt_ids is None:
            raise ValueError("router.pooling='sif' weighs tokens by id: pass prompt_ids")
        ids = prompt_ids.to(self.sif_weight.device)
        weight = self.sif_weight[ids]
        if self.unseen.unit == "word":
            tail = tail_mask(attention_mask.to(ids.device), self.tail_tokens).bool()
            new_word = unseen_words(~self.sif_seen[ids] & tail, self.sif_word_start[ids])
            weight = torch.where(new_word, torch.full_like(weight, self.unseen.weight), weight)
        return prompt_representation(
            hidden, attention_mask, "sif", self.tail_tokens, weight.to(hidden.device), self.sif_component
        )

    @torch.no_grad()
    def set_sif(
        self,
        weight: torch.Tensor,
        component: torch.Tensor,
        seen: torch.Tensor | None = None,
        word_start: torch.Tensor | None = None,
    ) -> None:
        """Install fitted SIF statistics: weight [vocab_size], component [hidden_size]; with
        ``unseen.unit == "word"`` also seen and word_start [vocab_size] bool (kept when None)."""
        if self.pooling != "sif":
            raise ValueError(f"set_sif on a head with router.pooling={self.pooling!r}")
        values = [("sif_weight", weight), ("sif_component", component)]
        if self.unseen.unit == "word":
            words = (("sif_seen", seen), ("sif_word_start", word_start))
            values += [(name, value) for name, value in words if value is not None]
        for name, value in values:
            buf = getattr(self, name)
            if tuple(value.shape) != tuple(buf.shape):
                raise ValueError(f"{name}: shape {tuple(value.shape)}, expected {tuple(buf.shape)}")
            buf.copy_(value.to(buf))

    def embed(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """prompt_ids [B, L] -> [B, L, H]: the tokens' rows of the frozen base embedding table."""
        if not hasattr(self, "base_embedding"):
            raise ValueError("embed needs a head built with router.input='base_embeddings'")
        return self.base_embedding[prompt_ids.to(self.base_embedding.device)]

    @torch.no_grad()
    def set_base_embedding(self, weight: torch.Tensor) -> None:
        """Install the base model's input embedding table [vocab_size, hidden_size]."""
        if not hasattr(self, "base_embedding"):
            raise ValueError("set_base_embedding on a head built without router.input='base_embeddings'")
        if tuple(weight.shape) != tuple(self.base_embedding.shape):
            raise ValueError(
                f"base_embedding: shape {tuple(weight.shape)}, expected {tuple(self.base_embedding.shape)} "
                "(the base model and the actor must share vocabulary and hidden size)"
            )
        self.base_embedding.copy_(weight.to(self.base_embedding))

    @staticmethod
    def act(
        logits: torch.Tensor,
        sample: bool = True,
        generator: torch.Generator | None = None,
        uniforms: torch.Tensor | None = None,
    ) -> RouterOutput:
        """Sample (or argmax) an action per row from logits [B, 3]. ``uniforms`` [B] in [0, 1): draw
        row b's action by inverse CDF at ``uniforms[b]`` (each row's own keyed stream) instead of
        ``multinomial`` on ``generator``."""
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        if sample and uniforms is not None:
            cdf = log_probs.exp().cumsum(-1)
            action = torch.searchsorted(cdf, uniforms[:, None] * cdf[:, -1:], right=True)
            action = action.squeeze(-1).clamp_(max=logits.shape[-1] - 1)
        elif sample:
            action = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(-1)
        else:
            action = log_probs.argmax(-1)
        return RouterOutput(logits, action, log_probs.gather(-1, action[:, None]).squeeze(-1))


# ---------------------------------------------------------------------------- SIF pooling
def tail_mask(attention_mask: torch.Tensor, tail_tokens: int) -> torch.Tensor:
    """[B, L] 1 on the last ``tail_tokens`` real tokens of each row (left or right padding)."""
    mask = attention_mask.to(torch.float32)
    from_end = mask.flip(-1).cumsum(-1).flip(-1)  # 1 on the last real token, 2 before it, ...
    return mask * (from_end <= tail_tokens).to(mask.dtype)


def token_counts(prompt_ids: list[list[int]], vocab_size: int, tail_tokens: int) -> torch.Tensor:
    """[V] float64: how often each token id occurs in the last ``tail_tokens`` ids of the prompts.

    Raises ValueError on an id outside [0, vocab_size), naming the prompt."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for i, ids in enumerate(prompt_ids):
        window = torch.as_tensor(list(ids)[-tail_tokens:] if tail_tokens > 0 else [], dtype=torch.long)
        if window.numel() and (int(window.min()) < 0 or int(window.max()) >= vocab_size):
            raise ValueError(f"prompt {i}: token id outside [0, {vocab_size}) in {window.tolist()}")
        counts += torch.bincount(window, minlength=vocab_size).to(torch.float64)
    return counts


def sif_token_weights(counts: torch.Tensor, a: float, unseen_weight: float = 1.0) -> torch.Tensor:
    """counts [V] -> weights [V] = a / (a + p), p = counts / counts.sum(); a token with count 0
    weighs ``unseen_weight`` (1.0: plain SIF's a / (a + 0)).

    Raises ValueError unless a > 0, unseen_weight >= 0 and some count is positive."""
    if not a > 0:
        raise ValueError(f"SIF weight parameter a must be > 0, got {a}")
    if not unseen_weight >= 0:
        raise ValueError(f"SIF unseen_weight must be >= 0, got {unseen_weight}")
    total = float(counts.sum())
    if not total > 0:
        raise ValueError("SIF weights need token counts: every count is 0")
    weight = a / (a + counts / total)
    return torch.where(counts > 0, weight, torch.full_like(weight, unseen_weight))


def unseen_words(unseen: torch.Tensor, word_start: torch.Tensor) -> torch.Tensor:
    """unseen [B, L] bool (an unseen token at the position), word_start [B, L] bool (the token
    begins a word) -> [B, L] bool: True at every position of a word that has an unseen token.

    A word is a word-start position and the non-start positions after it; a row's positions before
    its first word start are one word too."""
    word = word_start.long().cumsum(-1)  # [B, L] in 0..L: which word of the row a position is in
    has = torch.zeros(word.shape[0], word.shape[1] + 1, dtype=torch.long, device=word.device)
    has.scatter_reduce_(-1, word, unseen.long(), reduce="amax")
    return has.gather(-1, word).bool()


# byte-level BPE marks a leading space, newline or tab with these; SentencePiece marks a space with ▁
_WORD_MARKS = ("Ġ", "Ċ", "ĉ", "▁")


def word_starts(tokens: Sequence[str | None]) -> torch.Tensor:
    """A tokenizer's vocabulary as strings (``convert_ids_to_tokens``; None past its end) -> [V] bool:
    the token begins a word. WordPiece (a vocabulary with ``##`` pieces): every token but ``##``
    pieces. Byte-level BPE and SentencePiece: a token led by a space or line mark, or by anything but
    a letter or digit (punctuation, special tokens, bytes)."""
    wordpiece = any(t is not None and t.startswith("##") for t in tokens)
    flags = []
    for t in tokens:
        if not t:
            flags.append(True)
        elif wordpiece:
            flags.append(not t.startswith("##"))
        else:
            flags.append(t.startswith(_WORD_MARKS) or not t[0].isalnum())
    return torch.tensor(flags, dtype=torch.bool)


def common_component(pooled: torch.Tensor) -> torch.Tensor:
    """pooled [N, H] -> [H] the unit first right singular vector of the (uncentred) rows, its sign
    fixed so that its largest-magnitude entry is positive (the same vector on every call)."""
    if pooled.ndim != 2 or pooled.shape[0] == 0:
        raise ValueError(f"common_component needs [N>0, H] rows, got {tuple(pooled.shape)}")
    u = torch.linalg.svd(pooled.double(), full_matrices=False).Vh[0]
    return (u * torch.sign(u[u.abs().argmax()])).to(pooled.dtype)


def remove_component(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """x [B, H] minus its projection on u [H] (a unit vector, or zeros: x unchanged)."""
    u = u.to(x.dtype)
    return x - (x @ u)[:, None] * u
