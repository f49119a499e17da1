"""The FastAPI routers of the front door beside the generation routes: usage, rewards, deployments, batches.
Each route checks the caller and the body, then calls the package that owns the work."""
