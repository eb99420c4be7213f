"""ops/bench/fanout.py's verdicts against etcd's watch of the same run (issue 38): ratios and checks from results."""

from ops.bench import fanout


def _result(mode: str, median_ms: float | None, last_ms: float | None) -> dict:
    return {"mode": mode, "median_ms": median_ms, "last_subscriber_ms_median": last_ms}


def test_ratios_and_checks_against_etcd_of_the_same_run():
    results = [_result("longpoll", 43.7, 67.7), _result("sse", 17.0, 34.0), _result(fanout.ETCD_MODE, 34.6, 53.6)]
    vs = fanout._vs_etcd(results)
    assert vs == {"longpoll": {"median_ratio": 1.263, "last_subscriber_ratio": 1.263},
                  "sse": {"median_ratio": 0.491, "last_subscriber_ratio": 0.634}}
    checks = fanout._checks(results, vs)
    assert checks == {"longpoll_median_le_50ms": True, "sse_median_le_30ms": True,
                      "sse_median_le_0.5x_etcd": True, "sse_last_subscriber_le_etcd": True,
                      "longpoll_median_le_0.8x_etcd": False, "longpoll_last_subscriber_le_etcd": False}


def test_without_etcd_in_the_run_only_the_absolute_targets_are_checked():
    results = [_result("sse", 31.0, 40.0)]
    assert fanout._vs_etcd(results) == {}
    assert fanout._checks(results, {}) == {"sse_median_le_30ms": False}


def test_a_mode_with_no_receipt_fails_its_checks():
    results = [_result("sse", None, None), _result(fanout.ETCD_MODE, 30.0, 50.0)]
    vs = fanout._vs_etcd(results)
    assert vs == {"sse": {"median_ratio": None, "last_subscriber_ratio": None}}
    assert not any(fanout._checks(results, vs).values())


def test_the_tiny_value_run_of_etcd_is_a_reference_beside_the_route_run_and_never_the_verdict():
    # etcd-watch carries a route (the same bytes Stator sends), etcd-watch-tiny ~40 bytes: both in one run
    results = [_result("longpoll", 40.0, 60.0), _result(fanout.ETCD_MODE, 80.0, 100.0),
               _result(fanout.ETCD_TINY_MODE, 40.0, 50.0)]
    vs = fanout._vs_etcd(results)
    assert vs == {"longpoll": {"median_ratio": 0.5, "last_subscriber_ratio": 0.6}}
    assert fanout._vs_etcd(results, fanout.ETCD_TINY_MODE) == {
        "longpoll": {"median_ratio": 1.0, "last_subscriber_ratio": 1.2}}
    assert fanout._checks(results, vs)["longpoll_median_le_0.8x_etcd"] is True


def test_etcd_is_given_the_route_itself_changed_by_the_round_and_its_subscribers_read_it_back_whole():
    route = {"topic": "t", "version": 4, "config": {}, "queues": [{"queue": q, "broker": "b1"} for q in range(8)]}
    value = fanout._etcd_value(route, "round-1")
    assert fanout._read_route(value.encode()) == {**route, "config": {"round": "round-1"}}
    assert len(value) > len(str(route["queues"]))   # the route's bytes, not a token standing for them
    assert fanout._read_route(fanout._etcd_value(None, "round-1").encode()) == {"round": "round-1"}
