"""The LangGraph Server (Agent Server) API, the subset chat frontends use:
``protocol`` (wire models), ``service`` (assistants, threads, runs), ``router``.

Wire format checked against the installed ``langgraph-sdk`` (its SSE parser and schema
types) and exercised by tests through that client."""
