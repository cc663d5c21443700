"""agent-lab: reinforcement learning for LLM agents, after CMU 11-768 (AI Agents), Lecture 9.

Data flows one way through the package:

    envs (environment) -> policy (model, tokenizer) -> rollout -> estimators (advantage, loss)
    -> trainer (update) -> evaluation

``agent_lab.training`` holds the lecture's own scalar examples; ``agent_lab.estimators`` the batched
torch versions that the trainer, the book and the assignments all use.
"""

__version__ = "0.1.0"
