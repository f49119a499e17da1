"""The front door's way to the engines (runs in the front door): `dispatch.Dispatcher` sends a request to a
healthy deployment of its pool, through one `EngineClient` (engine/contract.py) per deployment."""
