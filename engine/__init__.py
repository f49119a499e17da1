"""The engine: vLLM workers behind NVIDIA Dynamo, and the front door's contract with them.

    engine/*.py      the contract (contract.py), errors, ids, session affinity, settings: shared by every process
    client/          runs in the front door: its way to a deployment's workers (Dynamo's KV router in-process, or
                     Dynamo's frontend over HTTP) and the dispatcher that fails over between deployments
    supervisor/      runs in the front door's process too: starts, watches, restarts and scales the processes
    worker/          loaded inside each vLLM worker process (python -m engine.worker.dynamo_worker)
    kv_tier/         the host-DRAM KV tier: its connector runs in the workers
"""
