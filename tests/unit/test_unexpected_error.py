"""A bug that escapes every handler is still answered as OpenAI JSON, and the connection is declared closed
(uvicorn closes it after such an answer)."""

from fastapi import FastAPI
from fastapi.testclient import TestClient

from rollout_server.errors import install_error_handlers


def test_an_unexpected_error_is_a_json_500_that_closes_the_connection():
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom():
        raise RuntimeError("a bug")

    resp = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert resp.status_code == 500
    assert resp.json()["error"] == {"message": "Internal error: RuntimeError", "type": "api_error",
                                    "param": None, "code": None}
    assert resp.headers["connection"] == "close"
