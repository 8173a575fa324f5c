"""The key and the trust store (replay/trust.py) on their own: what they accept and refuse.

Regression pinned here: the trust store was read 4 KiB at a time, so from the 64th recording a
user trusted, ``replay trust`` forgot the earliest ones.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from replay.trust import KeyUnusable, remember, sign, signed_payload, standing, user_key


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "home"
    monkeypatch.setenv("REPLAY_HOME", str(d))
    return d


def _meta(i: int) -> dict[str, object]:
    return {"program": {"kind": "script", "path": "/p/train.py"}, "env": {"argv": [str(i)]}}


def test_a_trust_store_of_many_recordings_forgets_none(home: Path) -> None:
    digests = []
    for i in range(150):
        got = standing(_meta(i), {}, "run", 3)
        assert got.kind == "foreign" and got.why.startswith("unsigned")
        remember(got.digest)
        digests.append(got.digest)
    assert all(standing(_meta(i), {}, "run", 3).kind == "trusted" for i in range(150))
    assert standing(_meta(150), {}, "run", 3).kind == "foreign"


def test_a_signature_verifies_with_its_key_only_and_over_every_signed_field(home: Path) -> None:
    key = user_key()
    assert key is not None
    meta = _meta(1)
    meta["signature"] = sign(signed_payload(meta, {"/p/train.py": "x = 1"}, "run", 3), key)
    assert standing(meta, {"/p/train.py": "x = 1"}, "run", 3).kind == "signed"
    assert standing(meta, {"/p/train.py": "x = 2"}, "run", 3).kind == "foreign"  # sources
    assert standing(meta, {"/p/train.py": "x = 1"}, "other", 3).kind == "foreign"  # run id
    assert standing(meta, {"/p/train.py": "x = 1"}, "run", 4).kind == "foreign"  # version
    (home / "key").unlink()
    user_key()  # another key (another user's, another machine's)
    got = standing(meta, {"/p/train.py": "x = 1"}, "run", 3)
    assert got.kind == "foreign" and "another key" in got.why


def test_a_key_others_can_read_or_a_link_is_refused(home: Path, tmp_path: Path) -> None:
    user_key()
    key = home / "key"
    os.chmod(key, 0o644)
    with pytest.raises(KeyUnusable, match="readable by others"):
        user_key()
    key.unlink()
    planted = tmp_path / "planted"
    planted.write_text("00" * 32)
    os.chmod(planted, 0o600)
    key.symlink_to(planted)
    with pytest.raises(KeyUnusable, match="cannot read"):
        user_key()
