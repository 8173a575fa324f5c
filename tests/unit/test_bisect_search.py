"""The search on synthetic subjects: no HDF5, no torch; the truth is known by construction."""

import math

import pytest

from replay.bisect import (
    Expression,
    NonFinite,
    Predicate,
    Raised,
    SearchError,
    auto_criterion,
    find_culprit,
    newest_healthy,
    verify_window,
)


class Synthetic:
    """A run of ``n`` steps whose state goes bad at ``bad_step``; replays are deterministic
    functions of the step unless told otherwise.

    ``kind``: "nan_grad" (grads NaN at bad_step, loss NaN from the next step), "nan_loss",
    "raise" (bad_step raises). Snapshots every ``every`` steps from 0; snapshot s is healthy
    iff s <= bad_step (the state before bad_step is still fine).
    """

    def __init__(self, n=100, every=10, bad_step=57, kind="nan_grad", keep_from=0, device="cpu"):
        self.n, self.every, self.bad, self.kind = n, every, bad_step, kind
        self.window = (keep_from, n - 1)
        self.snapshots = [s for s in range(keep_from, n, every)]
        self.device = device
        self.replayed, self.again, self.snap_checks, self.fresh = [], [], [], []
        self.flaky_again = False
        self.diverge_at = None

    def truth(self, t, replay=False):
        row = {
            "step": t,
            "loss": 1.0 + 1.0 / (t + 1),
            "grad_norm": 0.5,
            "param_fingerprint": 10.0 + t,
        }
        row.update(
            loss_nonfinite=0.0,
            grad_nonfinite=0.0,
            param_nonfinite=0.0,
            raised=0.0,
            scaler_skipped=math.nan,
            exception=None,
        )
        if self.kind == "raise" and t == self.bad:
            row.update(
                loss=math.nan,
                grad_norm=math.nan,
                param_fingerprint=math.nan,
                raised=1.0,
                loss_nonfinite=math.nan,
                grad_nonfinite=math.nan,
                param_nonfinite=math.nan,
            )
            if replay:
                row["exception"] = {"type": "IndexError", "message": "index 9 is out of bounds"}
        elif self.kind == "nan_grad" and t >= self.bad:
            row.update(
                grad_norm=math.nan,
                grad_nonfinite=1.0,
                param_fingerprint=math.nan,
                param_nonfinite=1.0,
            )
            if t > self.bad:
                row.update(loss=math.nan, loss_nonfinite=1.0)
        elif self.kind == "nan_loss" and t >= self.bad:
            row.update(
                loss=math.nan, loss_nonfinite=1.0, param_nonfinite=1.0, param_fingerprint=math.nan
            )
        if (
            replay
            and self.diverge_at is not None
            and t >= self.diverge_at
            and math.isfinite(row["loss"])
        ):
            row["loss"] = math.nextafter(row["loss"], 2.0)
        if not replay:
            row.pop("exception")
        return row

    def recorded_rows(self):
        return [self.truth(t) for t in range(self.n)]

    def recorded_exception(self, t):
        if self.kind == "raise" and t == self.bad:
            return {"type": "IndexError", "message": "index 9 is out of bounds"}
        return None

    def snapshot_healthy(self, s):
        self.snap_checks.append(s)
        return self.kind == "raise" or s <= self.bad

    def replay(self, t, *, keep=True, fresh=False):
        self.replayed.append(t)
        self.fresh.extend([t] if fresh else [])
        return self.truth(t, replay=True)

    def replay_again(self, t):
        self.again.append(t)
        row = self.truth(t, replay=True)
        if self.flaky_again:
            row["grad_norm"] = 0.25
        return row


def test_nan_gradient_reports_first_bad_step_before_the_nan_loss():
    s = Synthetic(bad_step=57)
    v = find_culprit(s, NonFinite())
    assert (v.first_bad_step, v.symptom_step) == (57, 58)
    assert v.snapshot == 50 and s.replayed == list(range(50, 58))
    assert v.reproducible and v.deterministic and s.again == [57]


@pytest.mark.parametrize("bad", [0, 9, 10, 11, 50, 99])
def test_cost_is_at_most_snapshot_every_plus_one(bad):
    s = Synthetic(n=100, every=10, bad_step=bad, kind="nan_loss")
    v = find_culprit(s, NonFinite())
    assert v.first_bad_step == bad
    assert v.replayed_steps == len(s.replayed) <= 10 + 1
    assert v.snapshot == bad - bad % 10


def test_snapshot_search_is_a_bisection():
    s = Synthetic(n=1000, every=10, bad_step=995, kind="nan_loss")
    v = find_culprit(s, NonFinite())
    assert v.snapshot == 990 and v.snapshots_checked == len(s.snap_checks) <= 8  # log2(100)+2


def test_a_healthy_newest_snapshot_costs_one_check():
    s = Synthetic(n=1000, every=10, bad_step=995, kind="nan_loss")
    v = find_culprit(s, NonFinite())
    assert s.snap_checks == [990] and v.snapshots_checked == 1


def test_newest_healthy_on_a_monotone_predicate():
    snaps = list(range(0, 100, 10))
    for cut in range(-5, 105):
        got, checks = newest_healthy(snaps, lambda x, cut=cut: x <= cut)
        want = max((x for x in snaps if x <= cut), default=None)
        assert got == want and checks <= 5  # the newest, then log2(9) rounded up


def test_no_healthy_snapshot_or_failure_before_the_window_is_an_error():
    s = Synthetic(n=100, bad_step=30, kind="nan_loss", keep_from=40)
    with pytest.raises(SearchError, match="before the replayable window"):
        find_culprit(s, NonFinite())


def test_exception_kind_replays_to_the_raising_step_and_checks_the_type():
    s = Synthetic(bad_step=33, kind="raise")
    v = find_culprit(s, auto_criterion(s.recorded_rows()))
    assert v.kind == "exception" and v.first_bad_step == 33 == v.symptom_step
    assert v.exception["type"] == "IndexError" and v.reproducible
    assert s.replayed == [30, 31, 32, 33]


def test_exception_of_another_type_on_replay_is_a_divergence():
    s = Synthetic(bad_step=33, kind="raise")
    orig = s.truth

    def other(t, replay=False):
        row = orig(t, replay)
        if replay and row.get("exception"):
            row["exception"] = {"type": "ValueError", "message": "different"}
        return row

    s.truth = other
    v = find_culprit(s, Raised())
    assert v.divergence.column == "exception" and v.reproducible is False


def test_predicate_kind_finds_the_spike_without_checking_snapshots():
    s = Synthetic(n=60, kind="none")
    base = s.truth

    def spiky(t, replay=False):
        row = base(t, replay)
        if t == 44:
            row["loss"] = 40.0
        return row

    s.truth = spiky
    v = find_culprit(s, Predicate(Expression.parse("loss > 10 * median_loss", ["loss"])))
    assert v.first_bad_step == 44 and s.snap_checks == [] and s.replayed == [40, 41, 42, 43, 44]


def test_healthy_window_says_what_it_checked():
    s = Synthetic(n=30, kind="none")
    v = find_culprit(s, NonFinite())
    assert v.healthy and v.checked == [0, 29] and s.replayed == []


def test_two_replays_that_disagree_mean_not_reproducible():
    s = Synthetic(bad_step=57)
    s.flaky_again = True
    v = find_culprit(s, NonFinite())
    assert v.first_bad_step == 57 and v.reproducible is False
    assert any("disagree" in n for n in v.notes)


def test_replay_differing_from_the_recording_is_reported_with_its_size():
    s = Synthetic(bad_step=57)
    s.diverge_at = 53
    v = find_culprit(s, NonFinite())
    assert v.deterministic is False and v.reproducible is False
    assert v.divergence.step == 53 and v.divergence.column == "loss"
    assert v.divergence.ulps == 1 and v.divergence.abs_diff > 0


def test_failure_that_does_not_reproduce_points_at_hardware():
    s = Synthetic(bad_step=57, kind="nan_loss")
    s.replay = lambda t, keep=True: {**Synthetic(kind="none").truth(t, True)}
    v = find_culprit(s, NonFinite())
    assert v.reproducible is False and v.first_bad_step == 57
    assert any("did not reproduce" in n for n in v.notes)


def test_amp_skipped_step_is_not_a_failure():
    row = {
        "step": 3,
        "grad_nonfinite": 1.0,
        "scaler_skipped": 1.0,
        "loss_nonfinite": 0.0,
        "param_nonfinite": 0.0,
    }
    assert NonFinite().first_symptom([row]) is None
    assert NonFinite().first_symptom([{**row, "scaler_skipped": 0.0}]).bound == 3


def test_verify_reports_every_step_and_the_first_divergence():
    s = Synthetic(n=20, kind="none")
    s.diverge_at = 12
    r = verify_window(s)
    assert r.replayed_steps == 20 and not r.deterministic
    assert r.first_divergence.step == 12 and len(r.divergences) == 8


def test_verify_starts_each_kept_snapshot_afresh_as_a_bisect_after_it_would():
    """A continuous replay from the window's first snapshot never tests the snapshots after it,
    which is where a bisect of a later failure starts."""
    s = Synthetic(n=25, every=10, kind="none")
    verify_window(s)
    assert s.fresh == [10, 20]


def test_a_float32_loss_one_ulp_off_is_said_to_be_one_ulp_off():
    """Regression: a replayed float32 loss 2 float32 ulps off was reported as '1073741824
    ulps' (pytorch/examples' gcn replayed with its sparse graph made dense): the health row
    keeps the loss as float64, and the distance was counted in float64's ulps."""
    import struct

    from replay.bisect.compare import compare_rows

    loss = 1.9059345722198486  # a float32 value
    up = struct.unpack(
        "<f", struct.pack("<I", struct.unpack("<I", struct.pack("<f", loss))[0] + 2)
    )[0]
    d = compare_rows({"loss": loss}, {"step": 12, "loss": up})
    assert d is not None and d.ulps == 2
    d = compare_rows({"loss": -loss}, {"step": 12, "loss": -up})
    assert d is not None and d.ulps == 2
    d = compare_rows({"loss": 0.1}, {"step": 1, "loss": math.nextafter(0.1, 1.0)})  # float64
    assert d is not None and d.ulps == 1
