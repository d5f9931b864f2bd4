"""skillbank as a service: content-routed planning over HTTP (FastAPI), hot-added families, a playground page,
and vLLM export / upstream mode for scale. ``create_app`` is the entry point; ``skillbank serve`` runs it."""
from skillbank.serve.config import ServeConfig

__all__ = ["ServeConfig", "create_app"]


def create_app(*args, **kwargs):
    """See :func:`skillbank.serve.app.create_app` (imported lazily: FastAPI is only needed to serve)."""
    from skillbank.serve.app import create_app as _create_app
    return _create_app(*args, **kwargs)
