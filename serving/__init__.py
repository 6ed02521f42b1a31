"""Serving: the HTTP app (OpenAI-compatible API) and the ``switchyard`` CLI.

The composition root: it reads the settings and builds the gateway and the graphs.
Nothing imports from ``serving``.
"""

from serving.app import create_app
from serving.settings import ConfigError, Settings, load_settings

__all__ = ["ConfigError", "Settings", "create_app", "load_settings"]
