"""Sequence packing for teacher-forced passes: several short transcripts share one row.

A batch of transcripts right-padded to the longest one wastes the padding's compute; in a crafting
batch that mixes levels about half the slots are padding (a level-1 transcript is a third as long as
a level-3 one). :func:`packed_logits` places the transcripts into rows of the same width by first-fit
decreasing, runs the model once with per-segment attention and positions (each transcript sees only
itself, from position 0), and returns the logits in the original ``[B, L, V]`` layout. The result
equals the unpacked pass up to floating-point rounding (test), so every loss is unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["pack_rows", "packed_logits"]


def pack_rows(lengths: list[int], capacity: int) -> list[list[int]]:
    """Group sequence indices into rows of total length <= ``capacity``, first-fit decreasing.

    Each index appears exactly once; rows keep their sequences longest first.
    """
    if any(n > capacity for n in lengths):
        raise ValueError(f"a sequence of length {max(lengths)} does not fit a row of {capacity} slots")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(capacity - lengths[i])
    return rows


def packed_logits(model, input_ids: Tensor, attention_mask: Tensor, min_saving: float = 0.1, **kwargs) -> Tensor:
    """``model(input_ids, attention_mask, **kwargs)`` for right-padded rows, computed on packed rows.

    Logits at padding positions are 0 (they are masked out of every loss). Falls back to the plain pass
    when packing would save fewer than ``min_saving`` of the rows (number-search transcripts are all about
    as long: 512 rows pack into 500, not worth the copying). Each packed segment's id is its original row,
    so a prefix-LM's ``prompt_lengths [B]`` (in ``kwargs``) serves the packed pass and the plain one alike.
    """
    B, L = input_ids.shape
    am = attention_mask.bool()
    lengths = am.sum(1)
    if not torch.equal(am, torch.arange(L, device=am.device)[None] < lengths[:, None]):
        raise ValueError("packed_logits needs right-padded rows (attention_mask a run of True then False)")
    rows = pack_rows(lengths.tolist(), L)
    if len(rows) > (1.0 - min_saving) * B:
        return model(input_ids, attention_mask, **kwargs)
    R = len(rows)
    packed = torch.zeros(R, L, dtype=input_ids.dtype, device=input_ids.device)
    segments = torch.full((R, L), -1, dtype=torch.long, device=input_ids.device)
    src, dst = [], []  # flat positions: packed slot <- original slot
    for r, members in enumerate(rows):
        offset = 0
        for b in members:
            n = int(lengths[b])
            packed[r, offset : offset + n] = input_ids[b, :n]
            segments[r, offset : offset + n] = b
            src.append(torch.arange(r * L + offset, r * L + offset + n))
            dst.append(torch.arange(b * L, b * L + n))
            offset += n
    logits = model(packed, segment_ids=segments, **kwargs)  # (R, L, V)
    V = logits.shape[-1]
    src_i, dst_i = torch.cat(src).to(logits.device), torch.cat(dst).to(logits.device)
    out = logits.new_zeros(B * L, V)
    out = out.index_copy(0, dst_i, logits.reshape(R * L, V).index_select(0, src_i))
    return out.view(B, L, V)
