"""Eval: the DeepEval regression suite and the gate on model swaps.

Sits on ``graphs``; only ``serving`` builds on it. Empty until the eval issue lands.
Never ``import eval`` bare (it would shadow the builtin): use ``from eval import ...``.
"""
