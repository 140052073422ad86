"""Schedules as action lists: 1F1B and GPipe orders, written out by hand."""

from hypothesis import given
from hypothesis import strategies as st

from hetpp.sim.schedule import Action, format_actions, rank_actions


def test_actions_print_short():
    assert str(Action(2, "F", 0)) == "2F0"
    assert str(Action(1, "B", 3)) == "1B3"
    assert str(Action(0, "OPT")) == "0OPT"


def test_1f1b_two_stages_four_micro_batches():
    # stage 0 warms up with S - s - 1 = 1 forward, then alternates, then drains.
    assert format_actions(rank_actions("1f1b", 0, 2, 4, optimizer=False)) == [
        "0F0", "0SEND_F0",
        "0F1", "0SEND_F1", "0RECV_B0", "0B0",
        "0F2", "0SEND_F2", "0RECV_B1", "0B1",
        "0F3", "0SEND_F3", "0RECV_B2", "0B2",
        "0RECV_B3", "0B3",
    ]  # fmt: skip
    assert format_actions(rank_actions("1f1b", 1, 2, 4, buckets=[(0, 1), (2, None)])) == [
        "1RECV_F0", "1F0", "1B0", "1SEND_B0",
        "1RECV_F1", "1F1", "1B1", "1SEND_B1",
        "1RECV_F2", "1F2", "1B2", "1SEND_B2",
        "1RECV_F3", "1F3", "1B3", "1SEND_B3",
        "1SYNC0", "1SYNC2", "1OPT",
    ]  # fmt: skip


def test_gpipe_all_forwards_then_all_backwards():
    acts = [a for a in rank_actions("gpipe", 1, 3, 3) if a.kind in ("F", "B")]
    assert format_actions(acts) == ["1F0", "1F1", "1F2", "1B0", "1B1", "1B2"]


@given(st.integers(1, 8), st.integers(1, 24), st.sampled_from(["1f1b", "gpipe"]))
def test_every_micro_batch_once_and_in_flight_bounded(num_stages, m, schedule):
    for s in range(num_stages):
        acts = rank_actions(schedule, s, num_stages, m, optimizer=False)
        fwd = [a.microbatch for a in acts if a.kind == "F"]
        bwd = [a.microbatch for a in acts if a.kind == "B"]
        assert fwd == list(range(m)) and bwd == list(range(m))
        held = peak = 0
        for a in acts:
            held += (a.kind == "F") - (a.kind == "B")
            peak = max(peak, held)
        assert peak == (m if schedule == "gpipe" else min(m, num_stages - s))
        # a forward's input arrives before it, its output leaves right after
        assert (s > 0) == any(a.kind == "RECV_F" for a in acts)
        assert (s < num_stages - 1) == any(a.kind == "SEND_F" for a in acts)
