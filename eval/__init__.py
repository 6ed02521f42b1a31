"""Eval: the DeepEval regression suite and the gate on model swaps.

Sits on ``graphs``; only ``serving`` builds on it. So far: golden datasets
(`eval.datasets`), deterministic metrics (`eval.metrics`) and the gate's statistics
(`eval.gate`); the runner, DeepEval's judged metrics and promotion come next.
Never ``import eval`` bare (it would shadow the builtin): use ``from eval import ...``.
"""
