"""Where a crafting policy's imitation loss sits: the planner's actions on fixed worlds, scored token by token
and grouped by the token's role in its action (the verb, the item a ``get`` or ``craft`` names, a ``get`` 's
count, the newline that ends the action, a thought's words).

A crafting action is ``get <item> <n>``, ``craft <item>`` or ``think <words>``, then a newline. The item of a
craft is split in two roles, the episode's first craft and the later ones: the first is chosen from the
prompt alone (no craft has happened yet), the later ones also from the inventory the crafts left.

The score is the negative log-likelihood under the distribution the rollout samples from (the structural
masks applied, temperature 1): its per-token mean over the worlds of a level is the imitation loss of that
level, and the roles' shares of its sum say which decisions the loss is made of.

An item the planner names is one of several wherever other actions keep the plan as short
(:func:`~agent_lab.envs.crafting_world.shortest_next`): its score then also charges the order the planner breaks
ties in. ``set_nll``, on the item roles, is ``-log`` of the probability the policy puts on all of those items
(the verb as the planner wrote it): what the policy has learnt of which items the goal needs and which crafts are
ready, the same measure whichever order a plan breaks ties in, so it compares policies trained on other plans.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from agent_lab.envs.crafting import ACTION_ROLES as ROLES
from agent_lab.envs.crafting import ITEM_ROLES
from agent_lab.envs.crafting_world import apply_action, shortest_next
from agent_lab.estimators.logprobs import token_logprobs
from agent_lab.rollout import demonstration_batch
from agent_lab.update import policy_logits



def action_roles(tokens: list[str], crafted_before: bool) -> list[str]:
    """The role of each token of one action, ``tokens``: its words, then the newline that closes it.
    ``crafted_before``: an earlier action of the episode was a craft."""
    verb, middle = tokens[0], []
    for i in range(1, len(tokens) - 1):
        if verb == "think":
            middle.append("thought")
        elif verb == "get":
            middle.append({1: "get item", 2: "get count"}.get(i, "other"))
        elif verb == "craft" and i == 1:
            middle.append("craft item, later" if crafted_before else "craft item, first")
        else:
            middle.append("other")
    return ["end"] if len(tokens) == 1 else ["verb", *middle, "end"]


def action_nll(model: torch.nn.Module, env, tokenizer, tasks: list[dict], group=lambda t: f"level {t['level']}"
               ) -> dict[str, dict[str, dict]]:
    """Per task group (``group(task)``, by default its level) and role (:data:`ROLES`): ``{"tokens": n,
    "nll": mean nats per token, "share": the role's part of the group's summed nats}``, and on the item roles
    (:data:`ITEM_ROLES`) ``"set_nll"``: the mean of ``-log`` the probability of the items that keep the plan
    shortest. The planner's demonstrations of ``tasks`` are scored by ``model`` (no gradients; its training mode
    is restored)."""
    batch = demonstration_batch(env, tokenizer, tasks)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = policy_logits(model, batch, 1.0)
            lp = token_logprobs(logits, batch.input_ids[:, 1:])
            norm = torch.logsumexp(logits, -1)
    finally:
        model.train(was_training)
    sums: dict = defaultdict(lambda: defaultdict(lambda: [0.0, 0, 0.0]))
    for r, task in enumerate(tasks):
        turns, targets, crafted, inv = batch.turn_ids[r], batch.input_ids[r, 1:], False, {}
        for t in sorted(set(turns.tolist()) - {-1}):
            pos = (turns == t).nonzero()[:, 0].tolist()
            words = [tokenizer.vocab[int(targets[p])] for p in pos]
            for i, (p, role) in enumerate(zip(pos, action_roles(words, crafted))):
                s = sums[group(task)][role]
                s[0] -= float(lp[r, p])
                s[1] += 1
                if role in ITEM_ROLES and i == 1:
                    ids = [tokenizer.index[x] for x in shortest_next(task, inv, env.max_get)[words[0]]]
                    s[2] -= float(torch.logsumexp(logits[r, p, ids], 0) - norm[r, p])
            if words[0] in ("get", "craft"):
                inv = apply_action(task, inv, " ".join(words[:-1]))
            crafted = crafted or words[0] == "craft"
    out = {}
    for g, roles in sorted(sums.items()):
        total = sum(s for s, _, _ in roles.values())
        out[g] = {role: {"tokens": n, "nll": s / n, "share": s / total if total else 0.0,
                         **({"set_nll": set_s / n} if role in ITEM_ROLES else {})}
                  for role in ROLES if role in roles for s, n, set_s in [roles[role]]}
    return out
