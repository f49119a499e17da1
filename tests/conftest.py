import os

# Keep vLLM/torch caches and temp files out of the user's home and /tmp clutter.
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
