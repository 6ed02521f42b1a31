"""The run host: one lifecycle for every run, whichever protocol started it.

`RunChecks` validates a run request before it takes anything; `RunHost.open` takes
what the run needs and gives it all back however the run ends; `RunRegistry` keeps
the records that cancel, join and resume address.
"""

from serving.runs.errors import ClientError, client_error
from serving.runs.checks import RunChecks, SamplingParams, json_problem, parse_sampling, run_messages
from serving.runs.host import BACKEND_HEADER, STAGES, ActiveRun, RunHook, RunHost, RunPlan, served_by
from serving.runs.registry import RunRecord, RunRegistry, RunStatus

__all__ = [
    "BACKEND_HEADER",
    "STAGES",
    "ActiveRun",
    "ClientError",
    "RunChecks",
    "RunHook",
    "RunHost",
    "RunPlan",
    "RunRecord",
    "RunRegistry",
    "RunStatus",
    "SamplingParams",
    "client_error",
    "json_problem",
    "parse_sampling",
    "run_messages",
    "served_by",
]
