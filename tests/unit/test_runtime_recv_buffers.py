"""`LiveBuffers`: torch's receive buffers hold their bytes from their receive to their release,
and a buffer torch did not allocate (a V schedule's local hand-over) is never touched."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from hetpp.runtime.recv_buffers import LiveBuffers


def _info(n: int) -> SimpleNamespace:
    return SimpleNamespace(is_root_arg=False, buffer=torch.zeros(n, dtype=torch.float64))


def test_buffers_hold_bytes_only_between_restore_and_release():
    bufs = LiveBuffers()
    infos = {0: (_info(4),), 1: (_info(4),), 2: (SimpleNamespace(is_root_arg=True, buffer=None),)}
    bufs.adopt(infos.values())
    assert [i[0].buffer.untyped_storage().nbytes() for i in (infos[0], infos[1])] == [0, 0]
    bufs.restore(infos[0])
    bufs.restore(infos[0])  # a second restore of a live buffer changes nothing
    bufs.restore(infos[1])
    infos[1][0].buffer.fill_(2.0)  # the receive writes into the restored storage
    assert (bufs.live_bytes, bufs.peak_bytes) == (64, 64)
    assert bufs.storages() == {
        i[0].buffer.untyped_storage().data_ptr() for i in infos.values() if i[0].buffer is not None
    }
    bufs.release(infos[0])
    bufs.release(infos[0])
    assert (bufs.live_bytes, bufs.peak_bytes) == (32, 64)
    assert infos[0][0].buffer.untyped_storage().nbytes() == 0
    bufs.reset_peak()
    assert bufs.peak_bytes == 32


def test_a_handed_over_tensor_is_left_alone():
    bufs = LiveBuffers()
    info = _info(4)
    bufs.adopt([(info,)])
    mine = torch.ones(4, dtype=torch.float64)
    info.buffer = mine  # what set_local_fwd_input does
    bufs.restore((info,))
    bufs.release((info,))
    assert bufs.live_bytes == 0 and mine.untyped_storage().nbytes() == 32
    assert torch.equal(mine, torch.ones(4, dtype=torch.float64))
