"""The bundled sample submissions, built from the assignment at grade time so they never go stale.

``python -m autograder.samples OUT`` writes one folder per student into ``OUT``:

* ``reference``: the release with every solution region filled from the source notebook (full marks);
* ``blank``: the release exactly as students receive it (zero);
* ``grpo_habits``: a student who carried GRPO over to Dr.GRPO: the advantages are divided by the
  group's standard deviation and the loss is normalised by each sequence's own length;
* ``off_by_direction``: reward-to-go summed forward in time (past rewards instead of future ones),
  the REINFORCE loss missing its 1/B, and the training plug-in maximising the loss (a sign error);
* ``zipped``: the reference solution handed in as a zip file (the pipeline accepts both forms).

Both buggy students get the other functions right, so their scores show partial credit.
"""
from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

import nbformat

SOLUTION_BLOCK = re.compile(r"^[ \t]*### BEGIN SOLUTION[^\n]*\n(.*?)^[ \t]*### END SOLUTION[^\n]*\n?",
                            re.S | re.M)

BUGGY = {
    "grpo_habits": {
        "dr_grpo_advantages": '''
def dr_grpo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    groups = rewards.reshape(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    return (centred / (groups.std(dim=1, keepdim=True) + 1e-6)).reshape(-1)  # GRPO, not Dr.GRPO
''',
        "dr_grpo_loss": '''
def dr_grpo_loss(logprobs, action_mask, advantages, max_tokens):
    lengths = action_mask.sum(dim=1).clamp(min=1)             # per-sequence length normalisation
    per_sequence = (action_mask * logprobs).sum(dim=1) / lengths
    return -(advantages * per_sequence).mean()
''',
    },
    "off_by_direction": {
        "reward_to_go": '''
def reward_to_go(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    out = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1]):                         # forward: sums the past, not the future
        running = rewards[..., t] + gamma * running
        out[..., t] = running
    return out
''',
        "reinforce_loss": '''
def reinforce_loss(logprobs, action_mask, coefficients):
    return -(action_mask * coefficients * logprobs).sum()     # missing 1/B
''',
        "train_agent": None,  # filled below: the reference plug-ins with the loss's sign flipped
    },
}


def solution_sources(source_nb: nbformat.NotebookNode) -> dict[str, str]:
    """grade_id -> the source notebook's solution cell with the solution markers removed."""
    out = {}
    for cell in source_nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            out[meta["grade_id"]] = SOLUTION_BLOCK.sub(lambda m: m.group(1), cell.source)
    return out


def fill(release_nb: nbformat.NotebookNode, bodies: dict[str, str]) -> nbformat.NotebookNode:
    """A copy of ``release_nb`` whose solution cells named in ``bodies`` get that source."""
    nb = nbformat.from_dict(release_nb)
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in bodies:
            cell.source = bodies[gid].strip("\n")
    return nb


def build(out: Path, source_nb: nbformat.NotebookNode, release_nb: nbformat.NotebookNode,
          name: str) -> list[Path]:
    """Write the sample submissions into ``out`` (replacing it); return the student entries."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    solutions = solution_sources(source_nb)
    train = solutions.get("train_agent", "")
    flipped = re.sub(r"return (dr_grpo_loss\(.*\))", r"return -\1", train)
    if flipped == train:
        raise ValueError("train_agent solution has no `return dr_grpo_loss(...)` line to flip")
    notebooks = {"reference": fill(release_nb, solutions), "blank": release_nb}
    for student, bugs in BUGGY.items():
        bodies = dict(solutions)
        bodies.update({k: (flipped if k == "train_agent" else v) for k, v in bugs.items()})
        notebooks[student] = fill(release_nb, bodies)
    entries = []
    for student, nb in notebooks.items():
        (out / student).mkdir()
        nbformat.write(nb, out / student / f"{name}.ipynb")
        entries.append(out / student)
    with zipfile.ZipFile(out / "zipped.zip", "w") as zf:
        zf.write(out / "reference" / f"{name}.ipynb", f"{name}/{name}.ipynb")
    entries.append(out / "zipped.zip")
    return entries
