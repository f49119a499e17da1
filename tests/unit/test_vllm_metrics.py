"""engine/supervisor/stack.py reads vLLM's Prometheus metrics: a metric's samples are summed over engines, filtered by label."""

from engine.supervisor.health import histogram_quantile, metric_total

PAGE = """# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="tiny-qwen2"} 12.5
vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny-qwen2"} 20.0
vllm:e2e_request_latency_seconds_sum{engine="1",model_name="tiny-qwen2"} 2.5
vllm:prompt_tokens_by_source_total{engine="0",source="local_compute"} 300.0
vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"} 700.0
vllm:num_requests_running 3.0
"""


def test_a_metric_is_summed_over_engines_whatever_its_name_holds():
    assert metric_total(PAGE, "vllm:e2e_request_latency_seconds_sum") == 15.0  # a digit in the name
    assert metric_total(PAGE, "vllm:e2e_request_latency_seconds_count") == 20.0
    assert metric_total(PAGE, "vllm:num_requests_running") == 3.0               # no labels


def test_labels_select_samples_and_a_missing_metric_is_zero():
    assert metric_total(PAGE, "vllm:prompt_tokens_by_source_total", source="local_compute") == 300.0
    assert metric_total(PAGE, "vllm:prompt_tokens_by_source_total") == 1000.0
    assert metric_total(PAGE, "vllm:generation_tokens_total") == 0.0


QUEUE = """vllm:request_queue_time_seconds_bucket{engine="0",le="0.001"} 2.0
vllm:request_queue_time_seconds_bucket{engine="0",le="0.01"} 6.0
vllm:request_queue_time_seconds_bucket{engine="0",le="0.1"} 10.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf"} 10.0
vllm:request_queue_time_seconds_bucket{engine="1",le="0.001"} 0.0
vllm:request_queue_time_seconds_bucket{engine="1",le="0.01"} 0.0
vllm:request_queue_time_seconds_bucket{engine="1",le="0.1"} 8.0
vllm:request_queue_time_seconds_bucket{engine="1",le="+Inf"} 10.0
"""


def test_a_histograms_quantile_is_interpolated_within_its_bucket_over_all_engines():
    # 20 observations: 2 <= 1 ms, 6 <= 10 ms, 18 <= 100 ms. The median (rank 10) lies 4/12 into (10, 100] ms.
    assert abs(histogram_quantile(QUEUE, "vllm:request_queue_time_seconds", 0.5) - (0.01 + 0.09 * 4 / 12)) < 1e-12
    assert histogram_quantile(QUEUE, "vllm:request_queue_time_seconds", 0.05) == 0.0005
    assert histogram_quantile(QUEUE, "vllm:request_queue_time_seconds", 0.99) == 0.1  # beyond the last finite bound
    assert histogram_quantile(QUEUE, "vllm:e2e_request_latency_seconds", 0.5) is None
