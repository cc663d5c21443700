"""How fast a crafting policy learns which items the goal needs, with nothing else to learn: a probe in minutes
for the skill that most failed crafting episodes get wrong first (an item off the goal's tree,
``agent_lab.envs.crafting.first_mistake``), where a learning curve of the whole task takes hours.

    python bench/crafting_membership.py --steps 2000 --arm base --arm "l8:n_layers=8" \\
        --out bench/results/crafting_membership.json

Each arm is a policy with a bidirectional prompt (``prompt_attention="bidirectional"``; the crafting recipe's
sizes) trained from random weights on ``needed_items_loss`` alone (``agent_lab.plugins.losses.needed_labels``),
read off the prompt of fresh training worlds, 32 a step, Adam at lr 1e-3. An arm, ``NAME:field=json,...``, sets
``ModelConfig`` fields, the crafting environment's training options (``level_weights``, ``train_distractors``)
or the optimisation (``TRAIN_FIELDS``). Every ``--every`` steps it is scored on the prompts of fixed test worlds
(``--worlds`` per level): the share of needed item mentions it calls needed, of the others it calls not needed,
and their mean (the balanced accuracy: a policy that calls every item needed scores 0.5, however many mentions
are needed). Each arm is written to ``--out`` as it goes (the file written whole, then moved into place).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

from _results import STARTED_AT, machine  # noqa: E402

from agent_lab.envs import make_env  # noqa: E402
from agent_lab.plugins.losses import needed_labels  # noqa: E402
from agent_lab.policy import ModelConfig, TinyTransformer, WordTokenizer  # noqa: E402
from agent_lab.recipes import recipe  # noqa: E402
from agent_lab.rollout import demonstration_batch  # noqa: E402

#: What an arm may set besides ``ModelConfig`` fields and the environment's ``ENV_FIELDS``, with the defaults.
TRAIN_FIELDS = {"lr": 1e-3, "batch": 32, "weight_decay": 0.0, "warmup": 0,  # warmup: steps of linear lr ramp
                "level1_steps": 0}  # level1_steps: the first steps draw level-1 worlds only (a curriculum)
ENV_FIELDS = ("level_weights", "train_distractors")
WORDS = ("ok", "invalid")  # the two words whose logits say needed / not needed, as needed_items_loss reads them


def balanced_accuracy(needed_logit: torch.Tensor, labels: torch.Tensor, where: torch.Tensor) -> dict[str, float]:
    """At the mentions ``where``: the share of needed ones (``labels``) called needed (``needed_logit > 0``), of
    the others called not needed, and their mean."""
    called = needed_logit > 0
    tpr = float((called & labels & where).sum()) / max(int((labels & where).sum()), 1)
    tnr = float((~called & ~labels & where).sum()) / max(int((~labels & where).sum()), 1)
    return {"needed_called_needed": tpr, "others_called_not": tnr, "balanced": (tpr + tnr) / 2}


def prompt_view(env, tok, tasks: list[dict]):
    """``(input_ids, attention_mask, prompt_lengths, where, labels)`` cut to the longest prompt."""
    b = demonstration_batch(env, tok, tasks)
    where, labels = needed_labels(b, tok, env.needed_items)
    P = int(b.prompt_lengths.max())
    return b.input_ids[:, :P], b.attention_mask[:, :P], b.prompt_lengths, where[:, :P], labels[:, :P]


def needed_logit(model, tok, view) -> torch.Tensor:
    ids, am, lengths = view[:3]
    z = model(ids, am, prompt_lengths=lengths)
    return z[..., tok.index[WORDS[0]]] - z[..., tok.index[WORDS[1]]]


def train_arm(name: str, fields: dict, steps: int, every: int, worlds: int, seed: int, on_row) -> list[dict]:
    cfg = recipe("crafting-full")
    train = {**TRAIN_FIELDS, **{k: v for k, v in fields.items() if k in TRAIN_FIELDS}}
    env_opts = {k: v for k, v in fields.items() if k in ENV_FIELDS}
    model_fields = {k: v for k, v in fields.items() if k not in TRAIN_FIELDS and k not in ENV_FIELDS}
    env = make_env("crafting", **{**cfg.env_options, "reread": False, **env_opts})
    easy = make_env("crafting", **{**cfg.env_options, "reread": False, **env_opts, "train_levels": [1],
                                   "level_weights": None}) if train["level1_steps"] else env
    tok = WordTokenizer.from_env(env)
    sizes = {k: getattr(cfg.model, k) for k in ("d_model", "n_layers", "n_heads", "max_len", "positions")}
    torch.manual_seed(seed)
    model = TinyTransformer(ModelConfig(len(tok), **{**sizes, "prompt_attention": "bidirectional", **model_fields}))
    opt = torch.optim.AdamW(model.parameters(), lr=train["lr"], weight_decay=train["weight_decay"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / max(train["warmup"], 1)))
    test = prompt_view(env, tok, env.eval_tasks("test", worlds * len(env.train_levels)))
    rng, rows, t0 = np.random.default_rng(seed), [], time.perf_counter()
    for step in range(steps + 1):
        if step % every == 0 or step == steps:
            with torch.no_grad():
                score = balanced_accuracy(needed_logit(model, tok, test), test[4], test[3])
            rows.append({"step": step, "worlds_seen": step * train["batch"], "train_s": time.perf_counter() - t0,
                         **score})
            on_row(name, rows)
        if step == steps:
            return rows
        source = easy if step < train["level1_steps"] else env
        _, _, _, where, labels = view = prompt_view(env, tok, source.sample_tasks(rng, train["batch"]))
        z = needed_logit(model, tok, view)[where]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z, labels[where].float())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()


def parse_arm(text: str) -> tuple[str, dict]:
    name, _, rest = text.partition(":")
    fields = {}
    for pair in filter(None, re.split(r",(?=[A-Za-z_]\w*=)", rest)):  # a comma inside a JSON list stays
        key, eq, value = pair.partition("=")
        if not eq:
            raise ValueError(f"arm {text!r}: write NAME:field=value,... (a field and a JSON value)")
        fields[key] = json.loads(value)
    return name, fields


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", action="append", default=None, help="NAME[:field=json,...]; repeat (default: base)")
    p.add_argument("--steps", type=int, default=2000, help="training steps per arm (32 worlds each)")
    p.add_argument("--every", type=int, default=50, help="score every this many steps")
    p.add_argument("--worlds", type=int, default=20, help="fixed test worlds per level")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "crafting_membership.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    arms = [parse_arm(a) for a in args.arm or ["base"]]
    record = {"command": "python bench/crafting_membership.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "commit": STARTED_AT, "machine": machine(), "seed": args.seed, "steps": args.steps,
              "worlds_per_level": args.worlds,
              "arms": {name: {"fields": fields, "rows": []} for name, fields in arms}}

    def on_row(name: str, rows: list[dict]) -> None:
        record["arms"][name]["rows"] = rows
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, args.out)

    for name, fields in arms:
        rows = train_arm(name, fields, args.steps, args.every, args.worlds, args.seed, on_row)
        print(f"{name}: balanced accuracy {rows[-1]['balanced']:.3f} after {rows[-1]['worlds_seen']:,} worlds")


if __name__ == "__main__":
    main()
