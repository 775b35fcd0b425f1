import torch

from llds.algo import action_segments, broadcast_segments, segment_sums


def test_action_index_by_hand():
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0, 0, 0]])
    idx, n = action_segments(mask)
    assert idx.tolist() == [[-1, 0, 0, -1, -1, 1, 1, 1, -1], [0, 0, 0, 0, -1, -1, -1, -1, -1]]
    assert n.tolist() == [2, 1]


def test_empty_row_and_alternating_mask():
    mask = torch.tensor([[0, 0, 0, 0], [1, 0, 1, 0]])
    idx, n = action_segments(mask)
    assert idx.tolist() == [[-1, -1, -1, -1], [0, -1, 1, -1]]
    assert n.tolist() == [0, 2]


def test_segment_sums_and_broadcast_round_trip():
    mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1]])
    idx, _ = action_segments(mask)
    vals = torch.tensor([[1.0, 2.0, 100.0, 4.0], [100.0, 1.0, 1.0, 1.0]])
    sums = segment_sums(vals, idx)
    assert sums.tolist() == [[3.0, 4.0], [3.0, 0.0]]
    back = broadcast_segments(sums, idx)
    assert back.tolist() == [[3.0, 3.0, 0.0, 4.0], [0.0, 3.0, 3.0, 3.0]]
