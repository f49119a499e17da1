"""The front door's Prometheus metrics: many observations added at once read as if observed one by one."""

from prometheus_client import CollectorRegistry, Histogram

from rollout_server.metrics import observe_all

BUCKETS = (0.005, 0.01, 0.02, 0.04)


def test_observe_all_matches_one_observe_per_value():
    values = [0.001, 0.005, 0.0051, 0.01, 0.015, 0.02, 0.03, 0.04, 0.5, 7.0, 0.005]
    one_by_one, all_at_once = CollectorRegistry(), CollectorRegistry()
    each = Histogram("itl_seconds", "gaps", buckets=BUCKETS, registry=one_by_one)
    for value in values:
        each.observe(value)
    observe_all(Histogram("itl_seconds", "gaps", buckets=BUCKETS, registry=all_at_once), values)
    assert samples(all_at_once) == samples(one_by_one)
    assert samples(all_at_once)["itl_seconds_bucket"][0] == ({"le": "0.005"}, 3.0)  # a value on a bound counts there


def samples(registry: CollectorRegistry) -> dict[str, list]:
    """name -> [(labels, value)], without the creation time (which differs)."""
    by_name: dict[str, list] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if not sample.name.endswith("_created"):
                by_name.setdefault(sample.name, []).append((sample.labels, round(sample.value, 12)))
    return by_name
