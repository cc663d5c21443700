"""The bundled sample submissions, built from the assignment at grade time so they never go stale.

``python -m autograder.samples OUT [ASSIGNMENT]`` writes one folder per student into ``OUT``. For
``policy_gradients`` (the default):

* ``reference``: the release with every solution region filled from the source notebook (full marks);
* ``blank``: the release exactly as students receive it (zero);
* ``grpo_habits``: a student who carried GRPO over to Dr.GRPO: the advantages are divided by the
  group's standard deviation and the loss is normalised by each sequence's own length;
* ``off_by_direction``: reward-to-go summed forward in time (past rewards instead of future ones),
  the REINFORCE loss missing its 1/B, and the training plug-in maximising the loss (a sign error);
* ``zipped``: the reference solution handed in as a zip file (the pipeline accepts both forms).

Both buggy students get the other functions right, so their scores show partial credit.

For ``crafting_agent`` (:func:`build_crafting`), each student hands in ``crafting_agent.pt`` beside the notebook:

* ``reference``: every solution, the two written answers, and the policy that the assignment's own training cell
  trains with the reference solution (seed 0; ``crafting_reference.pt`` here, see ``crafting_reference.json``);
* ``blank``: the release, no checkpoint (zero);
* ``observation_mask``: the mask on the input position instead of the target (an observation token's
  prediction in the loss) and termination bootstrapped like truncation; the reference policy;
* ``pickled_checkpoint``: the reference notebook with a checkpoint that runs code when unpickled (it would
  create ``/tmp/agentlab-sample-pickle-ran``): refused unread, zero for the agent, everything else scored.
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


CRAFTING_REFERENCE = Path(__file__).with_name("crafting_reference.pt")
PICKLE_MARKER = "/tmp/agentlab-sample-pickle-ran"
_CRAFTING_BUGS = {  # grade id -> (the reference line, its buggy replacement)
    "transcript_batch": ("return input_ids, attention, written[:, 1:]", "return input_ids, attention, written[:, :-1]"),
    "turn_returns": ("running = torch.where(terminated.bool(), torch.zeros_like(bootstrap), bootstrap)",
                     "running = bootstrap"),
}
WRITTEN_ANSWERS = {
    "explain_signal": "In a group whose episodes all got the same reward every advantage is reward minus the group "
                      "mean, which is 0, so no token of that group moves the loss. degenerate_fraction went from "
                      "most groups early in RL to fewer at the end; larger groups would give more mixed ones.",
    "explain_failures": "The agent fetched one ingredient too few and then tried to craft, got 'invalid' and ran "
                        "out of steps; per-turn credit would blame the craft turn rather than every turn.",
}


class _RunsCode:
    """A checkpoint payload that runs a shell command when unpickled (what a weights-only load refuses)."""

    def __reduce__(self):
        import os

        return (os.system, (f"touch {PICKLE_MARKER}",))


def build_crafting(out: Path, source_nb: nbformat.NotebookNode, release_nb: nbformat.NotebookNode,
                   name: str) -> list[Path]:
    """The crafting assignment's sample submissions (see the module docstring) in ``out`` (replacing it)."""
    import torch

    if not CRAFTING_REFERENCE.is_file():
        raise ValueError(f"{CRAFTING_REFERENCE} is missing: regenerate it with the command in crafting_reference.json")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    solutions = solution_sources(source_nb)
    answered = {**solutions, **WRITTEN_ANSWERS}
    buggy = dict(answered)
    for gid, (right, wrong) in _CRAFTING_BUGS.items():
        if right not in buggy[gid]:
            raise ValueError(f"the {gid} solution has no line {right!r} to break")
        buggy[gid] = buggy[gid].replace(right, wrong)
    students = {"reference": (answered, "reference"), "blank": ({}, None),
                "observation_mask": (buggy, "reference"), "pickled_checkpoint": (answered, "pickle")}
    entries = []
    for student, (bodies, checkpoint) in students.items():
        folder = out / student
        folder.mkdir()
        nbformat.write(fill(release_nb, bodies) if bodies else release_nb, folder / f"{name}.ipynb")
        if checkpoint == "reference":
            shutil.copyfile(CRAFTING_REFERENCE, folder / "crafting_agent.pt")
        elif checkpoint == "pickle":
            state = torch.load(CRAFTING_REFERENCE, weights_only=True)
            torch.save({**state, "config": _RunsCode()}, folder / "crafting_agent.pt")
        entries.append(folder)
    return entries


BUILDERS = {"policy_gradients": "build", "crafting_agent": "build_crafting"}


def solution_sources(source_nb: nbformat.NotebookNode) -> dict[str, str]:
    """grade_id -> the source notebook's solution cell with the solution markers removed."""
    out = {}
    for cell in source_nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code" and "grade_id" in meta:
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
