"""Batched torch estimators for RL on LLM agents: each a small pure function with its equation in the docstring.

Tensor contract (foundations chapter section 18, see ARCHITECTURE.md): token tensors are ``[B, L-1]`` aligned with the
*target* token ``input_ids[:, 1:]``; ``action_mask`` is 1 on policy-generated targets; turn tensors are
``[B, T]`` with a ``turn_mask``; groups are contiguous blocks of ``group_size`` rows. Surrogates are to be
maximised; a loss is ``-aggregate(...)``. Functions never modify their inputs. Bad input raises
``ValueError`` naming the argument, what it got and what it needs.

The scalar forms from the lecture live in :mod:`agent_lab.training`; tests check that both agree.
"""

from . import advantages, aggregation, baselines, credit, filtering, logprobs, policy_gradient, returns, shaping, statistics
from .advantages import *  # noqa: F403
from .aggregation import *  # noqa: F403
from .baselines import *  # noqa: F403
from .credit import *  # noqa: F403
from .filtering import *  # noqa: F403
from .logprobs import *  # noqa: F403
from .policy_gradient import *  # noqa: F403
from .returns import *  # noqa: F403
from .shaping import *  # noqa: F403
from .statistics import *  # noqa: F403

# The public names are each module's __all__, in data-flow order.
__all__ = [
    name
    for module in (returns, baselines, advantages, credit, logprobs, policy_gradient, aggregation, filtering, shaping,
                   statistics)
    for name in module.__all__
]
