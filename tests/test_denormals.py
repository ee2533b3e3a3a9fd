"""The gradient pass's flush-to-zero block: on every pool thread inside, off again after."""

from __future__ import annotations

import torch

from sodaray.search.denormals import flush_denormals


def denormal_product() -> torch.Tensor:
    # 1e-40: a float32 denormal. Large enough that torch splits the multiply across its
    # intra-op threads.
    return torch.full((1 << 22,), 1e-30) * torch.tensor(1e-10)


def test_flush_reaches_every_thread_and_is_undone():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert denormal_product().ne(0).all()  # default: denormals kept
        with flush_denormals():
            inside = denormal_product()
        after = denormal_product()
    finally:
        torch.set_num_threads(threads)
    # Every element zero, not only the share the calling thread computed.
    assert inside.eq(0).all()
    assert after.ne(0).all() and after[0].item() > 0


def test_block_for_another_device_changes_nothing():
    with flush_denormals("meta"):
        assert denormal_product().ne(0).all()
