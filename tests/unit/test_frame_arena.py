"""The writer process reads frame bodies into an arena reused from one commit to the next."""

from __future__ import annotations

import os
import threading

import numpy as np

from replay.store.writer_process import _FrameReader, _write_frame


def _frames(sizes):
    r, w = os.pipe()

    def feed():
        with os.fdopen(w, "wb") as out:
            for i, n in enumerate(sizes):
                _write_frame(out, {"op": "commit", "i": i}, [np.full(n, i % 251, np.uint8)])

    threading.Thread(target=feed, daemon=True).start()
    return _FrameReader(r), r


def test_bodies_stay_intact_until_released_then_the_arena_is_reused():
    reader, fd = _frames([3000, 5000, 2000, 4000, 100_000])
    try:
        window = [reader.read() for _ in range(2)]  # no arena yet: own buffers
        reader.release()  # the arena grows to what that window took: 8000 bytes
        a, b = reader.read(), reader.read()
        for (header, body), n in zip(window + [a, b], (3000, 5000, 2000, 4000)):
            assert len(body) == n and (np.frombuffer(body, np.uint8) == header["i"]).all()
        assert np.shares_memory(np.asarray(a[1]), reader._arena)
        assert np.shares_memory(np.asarray(b[1]), reader._arena)
        big = reader.read()  # past the arena's free space: its own buffer
        assert not np.shares_memory(np.asarray(big[1]), reader._arena)
        assert (np.frombuffer(big[1], np.uint8) == 4).all()
        for header, body in (a, b):  # nothing written over before the release
            assert (np.frombuffer(body, np.uint8) == header["i"]).all()
        reader.release()
        assert reader._arena.size == 2000 + 4000 + 100_000
        assert reader.read() is None  # EOF
    finally:
        os.close(fd)
