"""Tools: a registry with enforced allow-lists, timeouts, budgets and approvals.

Sits on ``knowledge`` (``knowledge_search``); ``graphs`` build on it. A tool the
policy does not allow is never executed: `ToolExecutor` is the only way a tool runs.
"""

from tools.base import Tool, ToolContext
from tools.errors import NameResolutionError, TargetRefusedError, ToolError, UnknownToolError
from tools.executor import ToolCallRecord, ToolDecision, ToolExecutor, args_hash
from tools.policy import NetworkPolicy, ToolPolicy
from tools.registry import ToolRegistry
from tools.resolver import Resolver, StaticResolver, SystemResolver
from tools.settings import HttpGetSettings, ToolsSettings

__all__ = [
    "HttpGetSettings",
    "NameResolutionError",
    "NetworkPolicy",
    "Resolver",
    "StaticResolver",
    "SystemResolver",
    "TargetRefusedError",
    "Tool",
    "ToolCallRecord",
    "ToolContext",
    "ToolDecision",
    "ToolError",
    "ToolExecutor",
    "ToolPolicy",
    "ToolRegistry",
    "ToolsSettings",
    "UnknownToolError",
    "args_hash",
]
