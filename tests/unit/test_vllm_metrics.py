"""engine/supervisor/stack.py reads vLLM's Prometheus metrics: a metric's samples are summed over engines, filtered by label."""

from engine.supervisor.health import metric_total

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
