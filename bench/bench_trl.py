"""Side by side with TRL: number search trained by TRL's ``GRPOTrainer`` and by agent-lab's Dr.GRPO, in one run.

What a practitioner would write with TRL 1.x: a GPT-2 model of the same size as the pure-RL recipe's policy, built
from a config in code (no download), a word-level tokenizer built offline from the environment's vocabulary, and
``GRPOTrainer`` with its Dr.GRPO loss (``loss_type="dr_grpo"``: rewards centred per group and not scaled, no KL,
one update per batch, and the normaliser ours uses, the most policy tokens an episode holds). The episodes are
multi-turn through TRL's own rollout hook (``rollout_func``): each turn is sampled with ``model.generate`` from the
whole transcript so far, the environment's answers join the completion with ``env_mask`` 0 so that only sampled
tokens are trained, and the episode's return is the reward.

TRL computes its loss over the whole vocabulary, so the comparison is the lecture's plain setting, without the
candidate mask: agent-lab's side is the recipe ``number-search/dr_grpo-no-mask`` with the same group size, batch,
learning rate and model size. Each side trains for the same wall-clock budget per seed (or until its greedy policy
finds all 15 of the 16 targets the planner finds), checked every ``EVAL_EVERY`` steps; the row gives seconds and
episodes to 15/16, or the greedy success when the budget ran out. TRL does not suppress ``<pad>``/``<bos>``/
``<unk>`` when sampling (a word outside the protocol makes an invalid guess); agent-lab's sampler never draws them.

Optional: ``pip install -e '.[trl]'`` (TRL is not a runtime dependency); without it the script says so and
exits 0, so ``make bench`` runs everywhere.

    python bench/bench_trl.py                 # seeds 0 1 2, 120 s per side and seed
    python bench/bench_trl.py --budget 300 --seeds 1
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

import torch

from _results import RESULTS, save_section

from agent_lab.envs import make_env
from agent_lab.policy import WordTokenizer
from agent_lab.recipes import recipe
from agent_lab.trainer import train

OUT = RESULTS / "bench_trl.json"
RECIPE = "number-search/dr_grpo-no-mask"
EVAL_EVERY = 5  # greedy check every 5 updates, as the recipe does


def hf_tokenizer(tok: WordTokenizer):
    """The same id map as agent-lab's tokenizer, as a ``PreTrainedTokenizerFast`` (words split on spaces)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(dict(tok.index), unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", unk_token="<unk>",
                                   eos_token="<nl>", padding_side="left")


def gpt2(tok: WordTokenizer, seed: int):
    """A GPT-2 of the recipe's width and depth, randomly initialised from ``seed``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    m = recipe(RECIPE).model
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=len(tok), n_embd=m.d_model, n_layer=m.n_layers, n_head=m.n_heads,
                     n_positions=m.max_len, bos_token_id=tok.bos_id, eos_token_id=tok.nl_id, pad_token_id=tok.pad_id,
                     resid_pdrop=m.dropout, embd_pdrop=m.dropout, attn_pdrop=m.dropout)  # GPT-2's default is 0.1
    return GPT2LMHeadModel(cfg)


@torch.no_grad()
def play(model, tok: WordTokenizer, targets: list[int], greedy: bool) -> list[dict]:
    """Multi-turn episodes: per turn, ``generate`` from each live transcript up to its ``<nl>``; returns per
    episode ``prompt_ids``, ``completion_ids`` (sampled tokens and the environment's answers), ``env_mask`` (1 on
    sampled tokens), ``logprobs`` (the sampler's, 0 on the environment's tokens), ``return``, ``success`` and the
    environment's ``observations``."""
    env = make_env("number-search", mask_actions=False)
    prompts = [[tok.bos_id] + tok.encode(p) + [tok.nl_id] for p in env.reset(targets)]
    eps = [{"prompt_ids": p, "completion_ids": [], "env_mask": [], "logprobs": [], "return": 0.0} for p in prompts]
    was_training = model.training
    model.eval()
    for _ in range(env.max_turns):
        live = [i for i in range(len(eps)) if not env.done[i]]
        if not live:
            break
        rows = [eps[i]["prompt_ids"] + eps[i]["completion_ids"] for i in live]
        width = max(map(len, rows))
        ids = torch.tensor([[tok.pad_id] * (width - len(r)) + r for r in rows])
        # the mask comes from the lengths: a sampled <pad> inside a transcript is a token like any other
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        out = model.generate(ids, attention_mask=mask, do_sample=not greedy, top_k=0,
                             temperature=1.0, max_new_tokens=env.max_action_words + 1, eos_token_id=tok.nl_id,
                             pad_token_id=tok.pad_id, output_logits=True, return_dict_in_generate=True)
        new = out.sequences[:, width:]
        lps = torch.stack(out.logits, 1).log_softmax(-1).gather(-1, new[..., None])[..., 0]
        texts = [""] * len(eps)
        for j, i in enumerate(live):
            toks = new[j].tolist()
            n = toks.index(tok.nl_id) + 1 if tok.nl_id in toks else len(toks)
            texts[i] = tok.decode(toks[:n]).strip()
            e = eps[i]
            e["completion_ids"] += toks[:n]
            e["env_mask"] += [1] * n
            e["logprobs"] += lps[j, :n].tolist()
            if toks[n - 1] != tok.nl_id:  # the action was cut at its length limit: the newline is not sampled
                e["completion_ids"].append(tok.nl_id)
                e["env_mask"].append(0)
                e["logprobs"].append(0.0)
        step = env.step(texts)
        for i in live:
            eps[i]["return"] += float(step.rewards[i])
            if not step.done[i]:
                answer = tok.encode(step.observations[i]) + [tok.nl_id]
                eps[i]["completion_ids"] += answer
                eps[i]["env_mask"] += [0] * len(answer)
                eps[i]["logprobs"] += [0.0] * len(answer)
    model.train(was_training)
    for e, log in zip(eps, env.episode_logs()):
        e["success"] = bool(log["success"])
        e["observations"] = [turn["observation"] for turn in log["turns"]]
    return eps


def greedy_success(model, tok: WordTokenizer) -> float:
    """Greedy success on all 16 targets (the planner's optimum is 15/16)."""
    eps = play(model, tok, list(range(1, make_env("number-search").n + 1)), greedy=True)
    return sum(e["success"] for e in eps) / len(eps)


def run_trl(seed: int, budget_s: float, steps: int | None = None) -> dict:
    """TRL's GRPOTrainer with the Dr.GRPO loss, multi-turn through ``rollout_func``, until 15/16 or the budget."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cfg = recipe(RECIPE, seed=seed)
    env = make_env("number-search", mask_actions=False)
    tok = WordTokenizer.from_env(env)
    model = gpt2(tok, seed)
    state = {"episodes": 0, "start": None, "reached": None, "curve": []}

    def rollout(prompts, trainer):  # prompts arrive repeated num_generations times: one episode each
        eps = play(trainer.model, tok, [int(p) for p in prompts], greedy=False)
        state["episodes"] += len(eps)
        return {k: [e[k] for e in eps] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask")} | {
            "episode_return": [e["return"] for e in eps]}

    class Stop(TrainerCallback):
        def on_step_end(self, args, train_state, control, **kw):
            step = train_state.global_step
            if step % EVAL_EVERY == 0:
                greedy = greedy_success(model, tok)
                state["curve"].append([state["episodes"], greedy])
                if greedy >= 15 / 16 and state["reached"] is None:
                    state["reached"] = {"seconds": time.perf_counter() - state["start"],
                                        "episodes": state["episodes"], "step": step}
            if state["reached"] or time.perf_counter() - state["start"] > budget_s:
                control.should_training_stop = True
            return control

    targets = [str(t) for t in env.sample_tasks(seed, 100_000)]
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, seed=seed, learning_rate=cfg.optimizer.lr, beta=0.0, loss_type="dr_grpo",
                          entropy_coef=cfg.algorithm.entropy_coef,
                          scale_rewards="none", num_generations=cfg.algorithm.group_size,
                          per_device_train_batch_size=cfg.algorithm.batch_size, gradient_accumulation_steps=1,
                          steps_per_generation=1, num_iterations=1, max_completion_length=env.max_policy_tokens,
                          max_steps=steps or 10**6, report_to=[], save_strategy="no", logging_strategy="no",
                          use_cpu=True, disable_tqdm=True, adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0,
                          lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=cfg.optimizer.grad_clip)
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, episode_return, **kw: episode_return,
                              args=args, train_dataset=Dataset.from_dict({"prompt": targets}),
                              processing_class=hf_tokenizer(tok), rollout_func=rollout, callbacks=[Stop()])
        state["start"] = time.perf_counter()
        trainer.train()
    return {"seed": seed, "side": "TRL GRPOTrainer (dr_grpo loss, rollout_func)", "steps": trainer.state.global_step,
            "seconds": time.perf_counter() - state["start"], "episodes": state["episodes"],
            "reached_s": (state["reached"] or {}).get("seconds"),
            "reached_episodes": (state["reached"] or {}).get("episodes"), "final_greedy": greedy_success(model, tok),
            "curve": state["curve"]}


def run_ours(seed: int, budget_s: float, steps: int | None = None) -> dict:
    """agent-lab's recipe with the same budget."""
    extra = {"steps": steps} if steps else {}
    r = train(recipe(RECIPE, seed=seed, time_limit_s=budget_s, **extra), progress=False)
    hit = r.reached_optimum_at or {}
    return {"seed": seed, "side": f"agent-lab {RECIPE}", "steps": len(r.history), "seconds": r.seconds,
            "episodes": r.episodes, "reached_s": hit.get("seconds"), "reached_episodes": hit.get("episodes"),
            "final_greedy": r.final_eval.success,
            "curve": [[h["episodes"], h["eval_success"]] for h in r.history if h.get("eval_success") is not None]}


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    """Both sides' rows, by the section of ``--results`` they were saved as (none without TRL)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--budget", type=float, default=120.0, help="seconds per side and seed")
    p.add_argument("--results", type=Path, default=OUT)
    p.add_argument("--tiny", action="store_true", help="two updates per side (the tests)")
    args = p.parse_args(argv)
    if importlib.util.find_spec("trl") is None:
        print("bench_trl: TRL is not installed; pip install -e '.[trl]' to run this side-by-side")
        return {}
    steps = 2 if args.tiny else None
    rows = []
    for seed in range(1 if args.tiny else args.seeds):
        for run in (run_ours, run_trl):
            row = run(seed, args.budget, steps)
            rows.append(row)
            if run is run_trl:  # agent-lab's greedy success after no more episodes than TRL played
                seen = [g for e, g in rows[-2]["curve"] if e <= row["episodes"]]
                row["agent_lab_greedy_at_these_episodes"] = seen[-1] if seen else None
            got = (f"15/16 at {row['reached_s']:.1f} s, {row['reached_episodes']} episodes" if row["reached_s"]
                   else f"not reached; greedy {row['final_greedy']:.3f} after {row['episodes']} episodes")
            print(f"  seed {seed} {row['side']:48s} {row['steps']:4d} steps {row['seconds']:6.1f} s  {got}",
                  flush=True)
    command = "python bench/bench_trl.py" + (" --tiny" if args.tiny else f" --budget {args.budget:g} --seeds "
                                                                           f"{args.seeds}")
    section = "tiny" if args.tiny else "main"
    save_section(args.results, section, rows, command)
    return {section: rows}


if __name__ == "__main__":
    main()
