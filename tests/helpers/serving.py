"""A real server on a loopback port for the HTTP tests (uvicorn and the app imported on use)."""

import contextlib
import socket
import threading
import time

PROMPT = "hello hello world, hello world again and again; hello"
KEY = "sekret-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(gen, **cfg):
    """A real uvicorn on a free loopback port, serving create_app(gen, ServeConfig(**cfg))."""
    import uvicorn

    from edgespec.runtime.apps.server import ServeConfig, create_app

    port = free_port()
    app = create_app(gen, ServeConfig(port=port, model_name="tiny", **cfg))
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        srv.should_exit = True
        th.join(timeout=10)
        app.state.jobs.put(None)  # ends the worker thread
