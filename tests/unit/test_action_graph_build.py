"""The action graph's build: every node after its two predecessors, each step and transfer once,
and an order that waits for a message nobody sends refused (the agreement of its longest path
with the simulator is tests/unit/test_closed_form_vs_sim.py's)."""

import pytest

from hetpp.cost.action_graph import graph
from hetpp.specs.schedule import SCHEDULES


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_nodes_come_after_their_predecessors_and_each_step_once(name):
    spec = SCHEDULES[name]
    chunks = 1 if spec.placement == "one" else 2
    num_devices, m = 3, 7  # m = 7: interleaved orders number micro-batches past m here
    g = graph(name, num_devices, chunks, m)
    assert all(p < n and q < n for n, (p, q) in enumerate(zip(g.first, g.second), start=1))
    steps = [a for d in range(num_devices) for a in spec.order(d, num_devices, chunks, m)]
    compute = [t for t in g.took.tolist() if t < 4 * num_devices * chunks]
    assert len(compute) == len(steps)  # the rest are transfers, one per step that sends
    assert sorted(g.ends.tolist()) == sorted(set(g.ends.tolist()))


def test_an_order_waiting_for_a_message_never_sent_is_a_deadlock():
    # DualPipeV on 2 devices with m = 2 < 4 stages: torch refuses it; its order waits forever
    with pytest.raises(ValueError, match="deadlocks on 2 devices, m = 2"):
        graph("dualpipev", 2, 2, 2)
