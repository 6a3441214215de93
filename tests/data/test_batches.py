import numpy as np
import pytest
import torch

from llmlab.data.batches import RandomWindows, fixed_window_batches, num_fixed_windows
from llmlab.errors import UserError


def test_random_windows_shapes_and_shift():
    tokens = np.arange(1000, dtype=np.uint16)
    s = RandomWindows(tokens, block=16, batch=4, seed=0)
    window = s.next_window()
    assert window.shape == (4, 17)  # inputs and targets: window[:, :-1] and window[:, 1:]
    x, y = window[:, :-1], window[:, 1:]
    assert (y[:, :-1] == x[:, 1:]).all()
    assert (y == x + 1).all()  # consecutive tokens: the target is the next one


def test_random_windows_resume_continues_the_stream():
    tokens = np.arange(1000, dtype=np.uint16)
    a = RandomWindows(tokens, 8, 2, seed=3)
    a.next_window()
    state = a.state_dict()
    expected = a.next_window()
    b = RandomWindows(tokens, 8, 2, seed=3)
    b.load_state_dict(state)
    assert (b.next_window() == expected).all()


def test_ranks_split_one_global_batch_that_depends_only_on_the_seed():
    tokens = np.arange(5000, dtype=np.uint16)
    one = RandomWindows(tokens, 8, 6, seed=3)
    ranks = [RandomWindows(tokens, 8, 2, seed=3, rank=r, world=3) for r in range(3)]
    for _ in range(4):  # N ranks with batch b draw what one process with batch N*b draws
        expected = one.next_window()
        got = torch.cat([r.next_window() for r in ranks])
        assert torch.equal(got, expected)
    assert not torch.equal(RandomWindows(tokens, 8, 6, seed=4).next_window(), RandomWindows(tokens, 8, 6, seed=3).next_window())


def test_fixed_windows_score_every_token_once():
    tokens = np.arange(103, dtype=np.uint16)
    batches = [(w[:, :-1], w[:, 1:]) for w in fixed_window_batches(tokens, block=10, batch=3)]
    ys = np.concatenate([y.numpy().ravel() for _, y in batches])
    assert num_fixed_windows(tokens, 10) == 10
    assert ys.tolist() == list(range(1, 101))
    assert [x.shape[0] for x, _ in batches] == [3, 3, 3, 1]


def test_partial_eval_spreads_windows_over_the_split():
    tokens = np.arange(1001, dtype=np.uint16)
    firsts = [int(w[i, 0]) for w in fixed_window_batches(tokens, block=10, batch=2, max_windows=4) for i in range(len(w))]
    assert firsts == [0, 330, 660, 990]


def test_corpus_smaller_than_one_block_is_a_user_error():
    with pytest.raises(UserError, match="fewer than one block"):
        RandomWindows(np.arange(10, dtype=np.uint16), block=16, batch=2, seed=0)
