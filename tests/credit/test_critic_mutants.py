"""Exact checks of the turn-level critic (agent_lab.critic): the documented default architecture, the exact
messages of its input checks, the shapes it accepts, what policy_features reads from the policy and the batch,
and fit_critic's defaults and gradient handling."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from agent_lab.critic import TurnCritic, decision_positions, decision_states, fit_critic, policy_features
from agent_lab.estimators import reduce_loss, value_loss
from agent_lab.policy import ModelConfig, TinyTransformer


def _message(excinfo) -> str:
    return str(excinfo.value)


# --- TurnCritic ---------------------------------------------------------------------------------------------


def test_default_critic_is_layernorm_then_two_tanh_layers_of_width_64_then_a_linear_output():
    critic = TurnCritic(3, seed=0)
    assert [type(m) for m in critic.net] == [nn.LayerNorm, nn.Linear, nn.Tanh, nn.Linear, nn.Tanh, nn.Linear]
    assert [(name, tuple(p.shape)) for name, p in critic.named_parameters()] == [
        ("net.0.weight", (3,)), ("net.0.bias", (3,)),
        ("net.1.weight", (64, 3)), ("net.1.bias", (64,)),
        ("net.3.weight", (64, 64)), ("net.3.bias", (64,)),
        ("net.5.weight", (1, 64)), ("net.5.bias", (1,)),
    ]
    assert critic.in_features == 3
    explicit = TurnCritic(3, hidden=64, layers=2, seed=0)
    assert all(torch.equal(p, q) for p, q in zip(critic.parameters(), explicit.parameters(), strict=True))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"in_features": 0}, "in_features must be a positive integer, got 0"),
    ({"in_features": 3, "hidden": 0}, "hidden must be a positive integer, got 0"),
    ({"in_features": 3, "hidden": True}, "hidden must be a positive integer, got True"),
])
def test_bad_critic_sizes_raise_the_exact_message(kwargs, message):
    with pytest.raises(ValueError) as excinfo:
        TurnCritic(**kwargs)
    assert _message(excinfo) == message


@pytest.mark.parametrize(("layers", "shown"), [(True, "True"), (1.5, "1.5"), ("2", "'2'"), (-1, "-1")])
def test_layers_that_are_not_a_non_negative_int_raise_the_exact_message(layers, shown):
    # True is an int to isinstance and 1.5 / "2" are not negative: only the type checks refuse them
    with pytest.raises(ValueError) as excinfo:
        TurnCritic(3, layers=layers)
    assert _message(excinfo) == f"layers must be a non-negative integer (0: a linear critic), got {shown}"


def test_a_critic_reads_a_single_feature_vector_and_returns_a_scalar():
    critic = TurnCritic(3, hidden=4, layers=1, seed=0)
    x = torch.tensor([1.0, -2.0, 0.5])
    value = critic(x)  # features [F] -> [] (the "..." of [..., F] may be empty)
    assert value.shape == ()
    assert torch.equal(value, critic(x[None])[0])


@pytest.mark.parametrize(("features", "got"), [
    ([1.0, 2.0, 3.0], "list"),
    (None, "NoneType"),
    (torch.tensor(1.0), "()"),
    (torch.zeros(2, 5), "(2, 5)"),
])
def test_bad_features_raise_the_exact_message(features, got):
    with pytest.raises(ValueError) as excinfo:
        TurnCritic(3, seed=0)(features)
    assert _message(excinfo) == f"features must be a tensor [..., 3], got {got}"


# --- decision_positions / decision_states --------------------------------------------------------------------


def test_decision_positions_by_hand():
    turn_ids = torch.tensor([[-1, 0, 0, -1, 1], [-1, -1, 0, 0, -1]])
    positions, present = decision_positions(turn_ids, 2)
    assert positions.dtype == torch.long and present.dtype == torch.bool
    assert torch.equal(positions, torch.tensor([[1, 4], [2, 0]]))
    assert torch.equal(present, torch.tensor([[True, True], [True, False]]))


def test_bad_turns_raise_the_exact_message():
    with pytest.raises(ValueError) as excinfo:
        decision_positions(torch.zeros(1, 2, dtype=torch.long), 0)
    assert _message(excinfo) == "turns must be a positive integer, got 0"


@pytest.mark.parametrize(("turn_ids", "got"), [
    (torch.zeros(3, dtype=torch.long), "(3,)"),
    (torch.zeros(1, 2, 2, dtype=torch.long), "(1, 2, 2)"),
    ([[0, 0]], "list"),
    (None, "NoneType"),
])
def test_turn_ids_that_are_not_a_2d_tensor_raise_the_exact_message(turn_ids, got):
    with pytest.raises(ValueError) as excinfo:
        decision_positions(turn_ids, 2)
    assert _message(excinfo) == f"turn_ids must be an integer torch.Tensor of shape [B, L-1], got {got}"


@pytest.mark.parametrize(("hidden", "turn_ids", "got"), [
    (torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.long), "(2, 3)"),  # turn_ids fit its first two dims
    (torch.zeros(1, 3, 2, 2), torch.zeros(1, 2, dtype=torch.long), "(1, 3, 2, 2)"),
    ([[[0.0]]], torch.zeros(1, 0, dtype=torch.long), "list"),
    (None, torch.zeros(1, 2, dtype=torch.long), "NoneType"),
])
def test_hidden_that_is_not_a_3d_tensor_raises_the_exact_message(hidden, turn_ids, got):
    with pytest.raises(ValueError) as excinfo:
        decision_states(hidden, turn_ids, 1)
    assert _message(excinfo) == f"hidden must be a tensor [B, L, d] of hidden states, got {got}"


# --- policy_features ------------------------------------------------------------------------------------------


class _RecordingPolicy:
    """hidden[b, l, k] = 100 b + 10 l + k, and a record of what hidden_states was called with."""

    def __init__(self):
        self.calls = []

    def hidden_states(self, input_ids, attention_mask):
        self.calls.append((input_ids, attention_mask))
        B, L = input_ids.shape
        return (100 * torch.arange(B)[:, None, None] + 10 * torch.arange(L)[None, :, None]
                + torch.arange(2)[None, None, :]).float()


def _batch():
    return SimpleNamespace(
        input_ids=torch.tensor([[5, 6, 7, 8, 9, 0], [5, 6, 7, 8, 0, 0]]),
        attention_mask=torch.tensor([[True, True, True, True, True, False], [True, True, True, True, False, False]]),
        turn_ids=torch.tensor([[-1, 0, 0, -1, 1], [-1, -1, 0, 0, -1]]),
        rewards=torch.zeros(2, 2),
    )


def test_policy_features_pass_the_batch_to_the_policy_and_pick_decisions_and_the_last_real_position():
    policy, batch = _RecordingPolicy(), _batch()
    decisions, after = policy_features(policy, batch)
    assert len(policy.calls) == 1
    assert policy.calls[0][0] is batch.input_ids and policy.calls[0][1] is batch.attention_mask
    # decisions at positions [[1, 4], [2, -]]; row 1 has no turn 1, so zeros
    assert torch.equal(decisions, torch.tensor([[[10.0, 11.0], [40.0, 41.0]], [[120.0, 121.0], [0.0, 0.0]]]))
    # the last real positions are 4 (5 real tokens) and 3 (4 real tokens)
    assert torch.equal(after, torch.tensor([[40.0, 41.0], [130.0, 131.0]]))


def test_policy_features_let_the_policy_refuse_a_left_padded_mask():
    # the real policy validates the mask it is given: a dropped mask would silently read left padding
    torch.manual_seed(0)
    model = TinyTransformer(ModelConfig(10, d_model=8, n_layers=1, n_heads=2, max_len=16))
    batch = _batch()
    batch.attention_mask = torch.tensor([[False, True, True, True, True, True], [True, True, True, True, False, False]])
    with pytest.raises(ValueError) as excinfo, torch.no_grad():
        policy_features(model, batch)
    assert _message(excinfo) == ("attention_mask must be right padding (each row's real tokens first, then padding); "
                                 "pack sequences with segment_ids instead")


# --- fit_critic -----------------------------------------------------------------------------------------------


def _data():
    g = torch.Generator().manual_seed(0)
    features = torch.randn(3, 2, 2, generator=g)
    targets = torch.randn(3, 2, generator=g)
    mask = torch.tensor([[True, True], [True, False], [True, True]])
    return features, targets, mask


def test_fit_critic_defaults_are_200_steps_at_lr_1e_2():
    features, targets, mask = _data()
    a, b = TurnCritic(2, hidden=3, layers=1, seed=0), TurnCritic(2, hidden=3, layers=1, seed=0)
    default = fit_critic(a, features, targets, mask)
    explicit = fit_critic(b, features, targets, mask, steps=200, lr=1e-2)
    assert len(default) == 200
    assert default == explicit
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_fit_critic_returns_the_loss_before_each_step():
    features, targets, mask = _data()
    critic = TurnCritic(2, hidden=3, layers=1, seed=0)
    with torch.no_grad():
        first = float(reduce_loss(*value_loss(critic(features), targets, mask)))
    losses = fit_critic(critic, features, targets, mask, steps=2)
    with torch.no_grad():
        third = float(reduce_loss(*value_loss(critic(features), targets, mask)))
    assert len(losses) == 2 and losses[0] == first and third != losses[1]


@pytest.mark.parametrize(("lr", "shown"), [(0, "0"), (0.0, "0.0"), (-1e-3, "-0.001"), (float("nan"), "nan")])
def test_a_non_positive_lr_raises_the_exact_message(lr, shown):
    with pytest.raises(ValueError) as excinfo:
        fit_critic(TurnCritic(2), torch.zeros(1, 1, 2), torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), lr=lr)
    assert _message(excinfo) == f"lr must be a positive number, got {shown}"


class _CriticWithSpare(nn.Module):
    """A critic with one parameter the loss never reaches."""

    def __init__(self):
        super().__init__()
        self.critic = TurnCritic(2, hidden=3, layers=1, seed=0)
        self.spare = nn.Parameter(torch.zeros(2))

    def forward(self, features):
        return self.critic(features)


def test_fit_critic_drops_stale_gradients_instead_of_zeroing_them_in_place():
    # zero_grad(set_to_none=True): a gradient left before the fit is released, never written into, and a
    # parameter the loss does not reach ends with no gradient at all
    features, targets, mask = _data()
    model = _CriticWithSpare()
    stale = torch.ones(1)
    model.critic.net[-1].bias.grad = stale
    model.spare.grad = torch.ones(2)
    fit_critic(model, features, targets, mask, steps=2)
    assert model.spare.grad is None
    assert torch.equal(model.spare, torch.zeros(2))
    assert torch.equal(stale, torch.ones(1))
    assert model.critic.net[-1].bias.grad is not stale


def test_a_seeded_critic_reseeds_no_accelerator_generator(monkeypatch):
    # fork_rng(devices=[]) saves and restores the CPU generator only; torch.manual_seed would also reseed every
    # CUDA device for good, which the docstring's "without touching torch's global random state" rules out.
    calls = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: calls.append(seed))
    before = torch.random.get_rng_state()
    TurnCritic(3, seed=7)
    assert calls == [] and torch.equal(torch.random.get_rng_state(), before)
