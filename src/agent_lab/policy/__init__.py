"""The policy: a word-level tokenizer and a small decoder-only transformer with a KV cache."""

from agent_lab.policy.model import KVCache, ModelConfig, TinyTransformer
from agent_lab.policy.tokenizer import WordTokenizer

__all__ = ["KVCache", "ModelConfig", "TinyTransformer", "WordTokenizer"]
