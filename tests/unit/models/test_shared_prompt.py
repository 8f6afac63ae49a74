"""The shared-prompt forward on the real tiny model: the same log-probs, entropies and gradients as
the plain full forward (uneven left padding, groups of different sizes in any row order,
temperature, LoRA), the module's passes and minibatches with it, and where it falls back."""

import copy

import pytest
import torch

from src.algorithms.losses import token_log_probs_and_entropy
from src.config.schema import AlgorithmConfig, AlgorithmGroupConfig, RouterHeadConfig
from src.models.loading import LoraSettings, decoder_of, load_causal_lm
from src.models.module import ToolRouterModule, position_ids
from src.models.prompt_cache import trim_reason
from src.models.shared_prefix import plain_response_logits, prompt_groups, shared_prompt_logits
from src.rollout.batch import RolloutBatch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GROUP_SIZES = [3, 1, 5, 2]  # one row alone, the others shared
PROMPT_LENGTHS = [9, 2, 6, 1]  # left padding differs between prompts (P = 9)
TRIMMABLE = [9, 2, 6, 3]  # no one-token prompt: the trimmed prompt pass applies (src.models.prompt_cache)


def random_batch(vocab: int, seed: int = 0, width: int = 7, shuffle: bool = True, lengths=PROMPT_LENGTHS):
    """(input_ids, attention_mask, group ids) [N, P + width]: random prompts and responses, response
    lengths 0..width (right padding), rows of a group scattered over the batch when ``shuffle``."""
    g = torch.Generator().manual_seed(seed)
    width_p = max(lengths)
    rows = []
    for group, (size, length) in enumerate(zip(GROUP_SIZES, lengths)):
        prompt = torch.randint(5, vocab, (length,), generator=g)
        rows += [(group, prompt, int(torch.randint(0, width + 1, (), generator=g))) for _ in range(size)]
    if shuffle:
        rows = [rows[i] for i in torch.randperm(len(rows), generator=g)]
    ids = torch.zeros(len(rows), width_p + width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (_, prompt, length) in enumerate(rows):
        ids[i, width_p - len(prompt) : width_p], mask[i, width_p - len(prompt) : width_p] = prompt, 1
        ids[i, width_p : width_p + length] = torch.randint(5, vocab, (length,), generator=g)
        mask[i, width_p : width_p + length] = 1
    return ids, mask, torch.tensor([r[0] for r in rows])


def scores(model, ids, mask, groups, width, temperatures, shared: bool):
    """(log-probs [N, T], entropy [N, T], gradients of a weighted masked sum) of one forward."""
    model.zero_grad()
    pos = position_ids(mask)
    if shared:
        logits = shared_prompt_logits(model, ids, mask, pos, groups, width)
    else:
        logits = plain_response_logits(model, ids, mask, pos, width)
    logp, ent = token_log_probs_and_entropy(logits, ids[:, -width:], temperatures)
    resp_mask = mask[:, -width:].float()
    weights = torch.linspace(-1.0, 2.0, logp.numel()).view_as(logp)
    ((logp * weights + 0.1 * ent) * resp_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach() * resp_mask, ent.detach() * resp_mask, grads


def assert_same(model, ids, mask, groups, width, temperatures):
    plain = scores(model, ids, mask, groups, width, temperatures, shared=False)
    shared = scores(model, ids, mask, groups, width, temperatures, shared=True)
    torch.testing.assert_close(shared[0], plain[0], rtol=0, atol=4e-6)
    torch.testing.assert_close(shared[1], plain[1], rtol=0, atol=4e-6)
    assert shared[2].keys() == plain[2].keys() and len(plain[2]) > 0
    for name, grad in plain[2].items():
        scale = float(grad.abs().max())
        assert scale > 0, name
        assert float((shared[2][name] - grad).abs().max()) <= 1e-5 * scale, name


@pytest.fixture
def model(tiny):
    return copy.deepcopy(tiny[0]).eval()  # eval: no dropout, so two passes are comparable


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_same_log_probs_entropy_and_gradients(model, shuffle, temperature):
    ids, mask, groups = random_batch(model.config.vocab_size, seed=1, shuffle=shuffle)
    temps = torch.full((len(ids),), temperature)
    assert_same(model, ids, mask, groups, 7, temps)


def test_per_row_temperatures_and_a_one_token_response(model):
    ids, mask, groups = random_batch(model.config.vocab_size, seed=2, width=1)
    temps = torch.linspace(0.5, 1.5, len(ids))
    assert_same(model, ids, mask, groups, 1, temps)


def test_lora_model(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, lora=LoraSettings(enable=True)).eval()
    with torch.no_grad():  # B starts at zero: give the adapters an effect and A a gradient
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    ids, mask, groups = random_batch(model.config.vocab_size, seed=3)
    temps = torch.full((len(ids),), 0.8)
    assert_same(model, ids, mask, groups, 7, temps)
    with model.disable_adapter(), torch.no_grad():  # the LoRA reference pass
        pos = position_ids(mask)
        plain = plain_response_logits(model, ids, mask, pos, 7)
        shared = shared_prompt_logits(model, ids, mask, pos, groups, 7)
    torch.testing.assert_close(shared, plain, rtol=0, atol=4e-6)


def test_prompt_groups_follow_the_attended_prompt(model):
    ids, mask, groups = random_batch(model.config.vocab_size, seed=4)
    found = prompt_groups(ids, mask, 7)
    # same partition as the construction's groups
    assert torch.equal(found[:, None] == found[None], groups[:, None] == groups[None])
    garbled = ids.clone()
    garbled[mask == 0] = 3  # ids under the mask do not matter
    assert torch.equal(prompt_groups(garbled, mask, 7), found)
    shifted_mask = mask.clone()
    row = int((mask[:, :9].sum(1) == 6).nonzero()[0])  # one of the group of 5
    shifted_mask[row, 2] = 1  # one more attended prompt token: another prompt
    assert int(prompt_groups(ids, shifted_mask, 7).unique().numel()) == len(GROUP_SIZES) + 1


def count_calls(model) -> list[int]:
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_falls_back_to_the_plain_forward_where_sharing_cannot_apply_or_pay(model):
    ids, mask, groups = random_batch(model.config.vocab_size, seed=5)
    pos = position_ids(mask)
    calls = count_calls(model)
    with torch.no_grad():
        plain = plain_response_logits(model, ids, mask, pos, 7)
        shared_prompt_logits(model, ids, mask, pos, groups, 7)
        assert calls[0] == 3  # plain + (prompts, responses)
        alone = shared_prompt_logits(model, ids, mask, pos, torch.arange(len(ids)), 7)
        assert calls[0] == 4  # no group shares a prompt: one plain forward
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
        model.train()
        checkpointed = shared_prompt_logits(model, ids, mask, pos, groups, 7)
        assert calls[0] == 5  # HF drops the cache under gradient checkpointing
    torch.testing.assert_close(alone, plain, rtol=0, atol=0)
    torch.testing.assert_close(checkpointed, plain, rtol=0, atol=4e-6)


# ---------------------------------------------------------------- the module


def make_module(tiny, shared: bool, **algo) -> ToolRouterModule:
    model = copy.deepcopy(tiny[0]).eval()
    cfg = AlgorithmGroupConfig(shared_prompt_forward=shared, **algo)
    module = ToolRouterModule(
        model, cfg, RouterHeadConfig(), reference_factory=lambda: copy.deepcopy(tiny[0])
    )
    module.manual_backward = lambda loss: loss.backward()  # no Trainer here: plain autograd
    module.setup("fit")
    with torch.no_grad():  # the actor moves away from the reference, so KL is not zero
        for p in module.actor.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.02)
    return module


def rollout(vocab: int, lengths=PROMPT_LENGTHS) -> RolloutBatch:
    ids, mask, groups = random_batch(vocab, seed=6, lengths=lengths)
    n, g = len(ids), torch.Generator().manual_seed(7)
    return RolloutBatch(
        input_ids=ids,
        attention_mask=mask,
        response_mask=mask[:, -7:].float(),
        rewards=torch.randn(n, generator=g),
        uids=groups.tolist(),
        rollout_log_probs=-3 + torch.randn(n, 7, generator=g),
        temperatures=torch.linspace(0.7, 1.2, n),
    )


def step_gradients(module: ToolRouterModule, rb: RolloutBatch):
    """(loss inputs, metric shares, gradients) of the first minibatch, as training_step runs it."""
    groups = module._prompt_groups(rb)
    chunks = module._minibatches(len(rb), groups)
    inputs = module._loss_inputs(rb, len(chunks), groups)
    module.actor.zero_grad()
    parts = module._minibatch_backward(rb, chunks[0], inputs, None)
    grads = {n: p.grad.clone() for n, p in module.actor.named_parameters() if p.grad is not None}
    return chunks, inputs, parts, grads


@pytest.mark.parametrize("lengths", [PROMPT_LENGTHS, TRIMMABLE], ids=["whole-prompt-pass", "trimmed"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_module_step_is_the_same_with_the_shared_forward(tiny, mode, lengths):
    """PPO minibatches (old pass), KL (reference pass), entropy; micro-batches that cut groups."""
    algo = {"loss_agg_mode": mode, "ppo_mini_batch_size": 8, "micro_batch_size": 3}
    algo |= {"entropy_coeff": 0.01, "kl_coef": 0.1}
    rb = rollout(tiny[0].config.vocab_size, lengths)
    plain = step_gradients(make_module(tiny, False, **algo), rb)
    shared = step_gradients(make_module(tiny, True, **algo), rb)
    # the same rows per minibatch, grouped by prompt in the shared module's
    for a, b in zip(plain[0], shared[0]):
        assert sorted(a.tolist()) == sorted(b.tolist())
        groups = prompt_groups(rb.input_ids, rb.attention_mask, 7)[b]
        assert torch.equal(groups, groups.sort().values)
    for name in ("old_log_probs", "ref_log_probs"):
        torch.testing.assert_close(getattr(shared[1], name), getattr(plain[1], name), rtol=0, atol=4e-6)
    assert plain[2].keys() == shared[2].keys() >= {"train/pg_loss", "train/kl", "train/entropy"}
    for key, value in plain[2].items():
        assert shared[2][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    for name, grad in plain[3].items():
        assert float((shared[3][name] - grad).abs().max()) <= 1e-5 * float(grad.abs().max()), name


def test_shared_forward_is_on_by_default():
    assert AlgorithmConfig().shared_prompt_forward is True


def test_equal_groups_in_runs_broadcast_the_prompt_cache(model, monkeypatch):
    """GRPO's case (groups of equal size, rows sorted by group as the minibatches sort them): the
    prompt cache is broadcast to the rows, not index-selected; same log-probs, entropies, gradients."""
    import src.models.shared_prefix as shared_prefix

    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(5, model.config.vocab_size, (n,), generator=g) for n in (9, 4, 6)]
    width_p, width, size = 9, 5, 3
    ids = torch.zeros(len(prompts) * size, width_p + width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i in range(len(ids)):
        prompt = prompts[i // size]
        ids[i, width_p - len(prompt) : width_p], mask[i, width_p - len(prompt) :] = prompt, 1
        ids[i, width_p:] = torch.randint(5, model.config.vocab_size, (width,), generator=g)
    groups = torch.arange(len(prompts)).repeat_interleave(size)

    def refuse(t, index):
        if t.dim() == 4:  # a layer's keys / values [U, kv heads, P, d]
            raise AssertionError("equal groups in runs must not index-select the cache")
        return torch.index_select(t, 0, index)

    monkeypatch.setattr(shared_prefix, "rows_of", refuse)
    assert_same(model, ids, mask, groups, width, torch.full((len(ids),), 0.9))


# ---------------------------------------------------------------- the trimmed prompt pass


def random_model(model_type: str):
    """A random 3-layer model: GQA (4 query heads on 2 kv heads), every bias drawn non-zero."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    common = {
        "vocab_size": 96, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "pad_token_id": 0,
    }  # fmt: skip
    torch.manual_seed(0)
    built = {
        "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**common)),
        "llama": lambda: LlamaForCausalLM(LlamaConfig(attention_bias=True, mlp_bias=True, **common)),
        "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(attention_bias=True, **common)),  # k-norm
    }[model_type]()
    with torch.no_grad():
        for name, p in built.named_parameters():
            if name.endswith(("bias", "norm.weight")):
                p.normal_(0.5 if name.endswith("bias") else 1.0, 0.5)
    return built.eval()


def last_layer_rows(model) -> list[int]:
    """Token rows the last decoder layer's MLP sees, per call (grows as the model runs)."""
    rows = []
    decoder_of(model).layers[-1].mlp.register_forward_hook(
        lambda _m, args, _o: rows.append(args[0].shape[:-1].numel())
    )
    return rows


@pytest.mark.parametrize("kind", ["embedded", "qwen2", "llama"])
def test_the_trimmed_prompt_pass_gives_the_full_passs_values_and_gradients(tiny, kind):
    # the random models (large biases and norm weights) in float64: in fp32 their last layer's
    # key-projection gradients cancel to ~1e-4 of their terms' size, so rounding alone moves them
    model = copy.deepcopy(tiny[0]).eval() if kind == "embedded" else random_model(kind).double()
    ids, mask, groups = random_batch(model.config.vocab_size, seed=8, lengths=TRIMMABLE)
    width, prompt_len = 7, max(TRIMMABLE)
    assert trim_reason(model, mask[:, :prompt_len]) is None
    rows = last_layer_rows(model)
    assert_same(model, ids, mask, groups, width, torch.linspace(0.6, 1.3, len(ids)))
    plain, shared = rows  # the plain forward's call, then the shared forward's only call
    assert plain == len(ids) * (prompt_len + width)
    # the last layer ran on the response pass alone (each row's last prompt token + T - 1 tokens):
    # not on the prompts (the whole pass would add U x P rows in a call of its own)
    assert shared == len(ids) * width


def test_the_trimmed_prompt_pass_under_lora(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, lora=LoraSettings(enable=True)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    ids, mask, groups = random_batch(model.config.vocab_size, seed=9, lengths=TRIMMABLE)
    assert trim_reason(model, mask[:, : max(TRIMMABLE)]) is None
    assert_same(model, ids, mask, groups, 7, torch.full((len(ids),), 0.8))


def test_the_whole_prompt_pass_runs_where_trimming_does_not_apply():
    """A model whose keys are normalised per head (Qwen3's k_norm) or a one-token prompt: the shared
    forward keeps the whole prompt pass, with the same values as the plain one."""
    qwen3 = random_model("qwen3").double()
    ids, mask, groups = random_batch(qwen3.config.vocab_size, seed=10, lengths=TRIMMABLE)
    assert trim_reason(qwen3, mask[:, :9]) == "model_type 'qwen3'"
    assert_same(qwen3, ids, mask, groups, 7, torch.full((len(ids),), 1.0))
    qwen2 = random_model("qwen2").double()
    ids, mask, groups = random_batch(qwen2.config.vocab_size, seed=10)  # a prompt of one token
    assert trim_reason(qwen2, mask[:, :9]) == "a prompt of one token"
    rows = last_layer_rows(qwen2)
    assert_same(qwen2, ids, mask, groups, 7, torch.full((len(ids),), 1.0))
    assert rows[1] == len(GROUP_SIZES) * 9  # the prompt pass's call: U x P rows


def test_uneven_groups_give_one_gradient_at_two_threads(model):
    """Groups of different sizes take the row-select spread of the prompt cache; its backward sums
    each prompt's rows in index order, so twelve backwards at 2 threads give the same bits (the
    plain ``t[index]`` left the order to the threads: two runs of one command differed)."""
    ids, mask, groups = random_batch(model.config.vocab_size, lengths=[90, 60, 75, 45], shuffle=True)
    width = 7
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = [scores(model, ids, mask, groups, width, torch.ones(len(ids)), shared=True)[2] for _ in range(12)]
    finally:
        torch.set_num_threads(before)
    for grads in runs[1:]:
        assert all(torch.equal(grads[n], runs[0][n]) for n in runs[0])
