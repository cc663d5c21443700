"""Wrong implementations of the crafting assignment's graded functions, in two groups.

``CRAFTING_MUTANTS`` pass every visible test and only the hidden tests catch them (a mask that drops policy
tokens equal to pad_id, padded rewards in the sum, an extra lambda, the clip on the wrong side for a negative
advantage, ...): every part keeps some, so passing the visible tests is not proof.  ``VISIBLY_CAUGHT`` are
each part's classic bug (the mask left on the input position, a terminated episode bootstrapped, the KL ratio
upside down): the visible tests fail on them with a message that names the bug, so a student does not see full
visible marks and then lose the hidden points.  ``test_crafting_assignment.py`` checks both groups.
"""

from __future__ import annotations

from .mutants import Mutant

_MASK = "def transcript_batch(episodes, pad_id):\n"
_BUILD = """\
    rows = [[t for ids, _ in episode for t in ids] for episode in episodes]
    policy = [[bool(mine) for ids, mine in episode for _ in ids] for episode in episodes]
    length = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), length), dtype=torch.bool)
    written = torch.zeros((len(rows), length), dtype=torch.bool)
    for i, (row, mine) in enumerate(zip(rows, policy)):
        input_ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        attention[i, :len(row)] = True
        written[i, :len(row)] = torch.tensor(mine, dtype=torch.bool)
"""
_RET = "def turn_returns(rewards, turn_mask, gamma, terminated, bootstrap):\n"
_GAE = "def turn_gae(rewards, values, turn_mask, gamma, lam, terminated, bootstrap):\n"
_PPO = "def ppo_loss(logprobs, old_logprobs, advantages, action_mask, clip_eps, ref_logprobs, kl_coef):\n"
_PPO_STATS = """\
    with torch.no_grad():
        pos, neg = mask & (adv > 0), mask & (adv < 0)
        stats = {"clip_fraction_pos": float((pos & (ratio > 1 + clip_eps)).sum()) / max(int(pos.sum()), 1),
                 "clip_fraction_neg": float((neg & (ratio < 1 - clip_eps)).sum()) / max(int(neg.sum()), 1),
                 "kl_ref": float(torch.where(mask, k3, torch.zeros_like(k3)).sum() / n)}
    return loss, stats
"""
_PPO_HEAD = """\
    mask = action_mask.bool()
    adv = advantages[:, None].to(logprobs.dtype).expand_as(logprobs)
    ratio = torch.exp(logprobs - old_logprobs)
    n = mask.sum().clamp(min=1)
"""
_GAE_LOOP = """\
    real = turn_mask.bool()
    after = torch.where(terminated.bool(), torch.zeros_like(bootstrap), bootstrap).to(rewards.dtype)
    out = torch.zeros_like(rewards)
    next_value, running = after, torch.zeros_like(after)
    for t in range(rewards.shape[1] - 1, -1, -1):
"""

CRAFTING_MUTANTS: dict[str, Mutant] = {
    # ------------------------------------------------------------------ transcript_batch
    "mask_drops_tokens_equal_to_pad_id": Mutant("transcript_batch", "the mask leaves out policy tokens whose "
                                                "id equals pad_id", _MASK + _BUILD
                                                + "    return input_ids, attention, written[:, 1:] & "
                                                  "(input_ids != pad_id)[:, 1:]\n"),
    "padding_from_token_values": Mutant("transcript_batch", "attention_mask from input_ids != pad_id", _MASK + _BUILD
                                        + "    return input_ids, input_ids != pad_id, written[:, 1:] & "
                                          "(input_ids != pad_id)[:, 1:]\n"),
    # ------------------------------------------------------------------ turn_returns
    "returns_count_padded_rewards": Mutant("turn_returns", "padded turns' rewards enter the sum", _RET + """\
    running = torch.where(terminated.bool(), torch.zeros_like(bootstrap), bootstrap).to(rewards.dtype)
    out = torch.zeros_like(rewards)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running
        out[:, t] = torch.where(turn_mask.bool()[:, t], running, torch.zeros_like(running))
    return out
"""),
    "returns_discount_through_padding": Mutant("turn_returns", "the final value is discounted at every padded turn",
                                               _RET + """\
    real = turn_mask.bool()
    running = torch.where(terminated.bool(), torch.zeros_like(bootstrap), bootstrap).to(rewards.dtype)
    out = torch.zeros_like(rewards)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = torch.where(real[:, t], rewards[:, t] + gamma * running, gamma * running)
        out[:, t] = torch.where(real[:, t], running, torch.zeros_like(running))
    return out
"""),
    # ------------------------------------------------------------------ turn_gae
    "gae_lambda_once_too_often": Mutant("turn_gae", "A_t = delta_t + gamma lam^2 A_{t+1}: the same at lam 0 and 1",
                                        _GAE + _GAE_LOOP + """\
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * lam * running
        out[:, t] = torch.where(real[:, t], advantage, torch.zeros_like(advantage))
        running = torch.where(real[:, t], advantage, running)
        next_value = torch.where(real[:, t], values[:, t], next_value)
    return out
"""),
    "gae_bootstrap_at_termination": Mutant("turn_gae", "the bootstrap value follows terminated rows too",
                                           _GAE + _GAE_LOOP.replace(
                                               "torch.where(terminated.bool(), torch.zeros_like(bootstrap), bootstrap)",
                                               "bootstrap") + """\
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * running
        out[:, t] = torch.where(real[:, t], advantage, torch.zeros_like(advantage))
        running = torch.where(real[:, t], advantage, running)
        next_value = torch.where(real[:, t], values[:, t], next_value)
    return out
"""),
    "gae_padded_values": Mutant("turn_gae", "the next column's value even after a row's last real turn", _GAE + """\
    real = turn_mask.bool()
    after = torch.where(terminated.bool(), torch.zeros_like(bootstrap), bootstrap).to(rewards.dtype)
    nxt = torch.cat([values[:, 1:], after[:, None]], dim=1)
    delta = rewards + gamma * nxt - values
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(after)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = torch.where(real[:, t], delta[:, t] + gamma * lam * running, torch.zeros_like(running))
        out[:, t] = running
    return out
"""),
    "gae_no_gamma_on_the_next_value": Mutant("turn_gae", "delta_t = r_t + V_{t+1} - V_t (gamma left out)",
                                             _GAE + _GAE_LOOP + """\
        delta = rewards[:, t] + next_value - values[:, t]
        advantage = delta + gamma * lam * running
        out[:, t] = torch.where(real[:, t], advantage, torch.zeros_like(advantage))
        running = torch.where(real[:, t], advantage, running)
        next_value = torch.where(real[:, t], values[:, t], next_value)
    return out
"""),
    # ------------------------------------------------------------------ ppo_loss
    "ppo_clip_wrong_side_for_negative": Mutant("ppo_loss", "for A < 0 the max is taken: the clip acts on the wrong "
                                               "side", _PPO + _PPO_HEAD + """\
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    surrogate = torch.where(adv >= 0, torch.min(ratio * adv, clipped), torch.max(ratio * adv, clipped))
    log_r = ref_logprobs - logprobs
    k3 = torch.expm1(log_r) - log_r
    loss = torch.where(mask, -surrogate + kl_coef * k3, torch.zeros_like(k3)).sum() / n
""" + _PPO_STATS),
    "ppo_mean_over_every_position": Mutant("ppo_loss", "the mean over all B * (L-1) positions, not the policy tokens",
                                           _PPO + _PPO_HEAD.replace("n = mask.sum().clamp(min=1)",
                                                                    "n = mask.numel()") + """\
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    log_r = ref_logprobs - logprobs
    k3 = torch.expm1(log_r) - log_r
    loss = torch.where(mask, -surrogate + kl_coef * k3, torch.zeros_like(k3)).sum() / n
""" + _PPO_STATS),
    "ppo_clip_fraction_over_all_tokens": Mutant("ppo_loss", "clip fractions divided by all policy tokens, not those "
                                                "of that sign", _PPO + _PPO_HEAD + """\
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    log_r = ref_logprobs - logprobs
    k3 = torch.expm1(log_r) - log_r
    loss = torch.where(mask, -surrogate + kl_coef * k3, torch.zeros_like(k3)).sum() / n
""" + _PPO_STATS.replace("/ max(int(pos.sum()), 1)", "/ max(int(mask.sum()), 1)")
    .replace("/ max(int(neg.sum()), 1)", "/ max(int(mask.sum()), 1)")),
}

# Each part's classic bug, with the words the visible test's message must use to name it.
_UNSHIFTED = Mutant("transcript_batch", "the mask left unshifted: column j marks token j, not j + 1",
                    _MASK + _BUILD + "    return input_ids, attention, written[:, :-1]\n")
_TWO_AHEAD = Mutant("transcript_batch", "off by one the other way: column j marks token j + 2", _MASK + _BUILD
                    + "    shifted = torch.zeros_like(written[:, 1:])\n"
                      "    shifted[:, :-1] = written[:, 2:]\n"
                      "    return input_ids, attention, shifted\n")
_BOOTSTRAP_TERMINATED = Mutant("turn_returns", "bootstraps every row, terminated or not", _RET + """\
    real = turn_mask.bool()
    running = bootstrap.to(rewards.dtype)
    out = torch.zeros_like(rewards)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = torch.where(real[:, t], rewards[:, t] + gamma * running, running)
        out[:, t] = torch.where(real[:, t], running, torch.zeros_like(running))
    return out
""")
_KL_UPSIDE_DOWN = Mutant("ppo_loss", "k3 with r = pi / pi_ref: the KL ratio the wrong way round",
                         _PPO + _PPO_HEAD + """\
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    log_r = logprobs - ref_logprobs
    k3 = torch.expm1(log_r) - log_r
    loss = torch.where(mask, -surrogate + kl_coef * k3, torch.zeros_like(k3)).sum() / n
""" + _PPO_STATS)
VISIBLY_CAUGHT: dict[str, tuple[Mutant, str]] = {
    "mask_on_the_input_position": (_UNSHIFTED, "the mask is left unshifted, on the input position"),
    "mask_two_ahead": (_TWO_AHEAD, "shifted two tokens ahead"),
    "returns_bootstrap_at_termination": (_BOOTSTRAP_TERMINATED,
                                         "a terminated episode is bootstrapped"),
    "ppo_kl_ratio_upside_down": (_KL_UPSIDE_DOWN, "the KL ratio is taken the wrong way round"),
}
