"""The remap_pause benchmark's figures: the pause is the switch between brokers, not any slow send of the round."""

from ops.bench.remap_pause import round_pauses

OLD, NEW = "http://b1", "http://b2"


def _acks(*spec):
    return [(t, [i], addr) for i, (t, addr) in enumerate(spec)]


def test_slow_send_after_the_switch_is_a_stall_not_the_pause():
    # Remap at 1.0: last ack on the old broker at 1.01, first on the new one at 1.05 (a 40 ms refusal window); then an
    # ordinary send on the new broker waits 300 ms for its fsync.
    acks = _acks((0.99, OLD), (1.01, OLD), (1.05, NEW), (1.06, NEW), (1.36, NEW), (1.37, NEW))
    [(pause, stall)] = round_pauses(acks, [1.0], end=1.5)
    assert round(pause) == 40
    assert round(stall) == 300


def test_the_window_starts_at_the_last_ack_before_the_remap():
    acks = _acks((0.98, OLD), (1.08, NEW), (1.09, NEW))
    [(pause, stall)] = round_pauses(acks, [1.0], end=1.5)
    assert round(pause) == 100
    assert round(stall) == 10


def test_a_queue_that_never_moved_counts_the_whole_round():
    acks = _acks((0.99, OLD), (1.2, OLD), (1.6, NEW))
    pauses = round_pauses(acks, [1.0, 1.5], end=2.0)
    assert round(pauses[0][0]) == 510  # from the last ack before the remap to the next remap
    assert round(pauses[1][0]) == 400  # the second round switches: 1.2 -> 1.6
