"""Judged metrics through DeepEval, with a gateway alias as the judge; DeepEval offline.

Three metrics need a judge model: ``faithfulness`` (the answer's claims are supported by
the retrieved chunks: DeepEval's ``FaithfulnessMetric``), ``answer_relevancy`` (the
answer's statements address the question: ``AnswerRelevancyMetric``) and ``correctness``
(a G-Eval rubric: the answer states the case's expected facts, or, on an unanswerable
case, says it has no relevant information). `Judge` scores one case on all three.

The judge is any LangChain chat model, in practice ``gateway.chat_model(alias)`` for the
alias the eval settings name. It is handed to DeepEval as a model object
(`DeepEvalBaseLLM`), never through DeepEval's provider settings: no dummy OpenAI key,
no ``USE_LOCAL_MODEL`` pointing anywhere. Each DeepEval step that expects a pydantic
verdict asks the backend for JSON constrained by that schema (``response_format``
``json_schema``, which llama-server turns into a grammar), so even a small local model
returns JSON that parses.

A judge that fails (unparseable JSON, a timeout, a backend error) costs that metric of
that case, never the run: the metric's value is ``None`` and ``errors`` says why, and
the run file counts it (`eval.metrics.error_counts`).

`tool_correctness` is DeepEval's deterministic ``ToolCorrectnessMetric`` (no model is
called); ``eval.metrics.tools_match`` delegates to it.

DeepEval reads its environment when it is imported, so `configure_deepeval` must run
first; nothing in ``eval`` imports ``deepeval`` at module level.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage
from pydantic import BaseModel, ValidationError

from eval.metrics import normalise

if TYPE_CHECKING:
    from deepeval.metrics import BaseMetric
    from deepeval.models import DeepEvalBaseLLM

    from eval.datasets import Case
    from eval.runner import CaseOutput

__all__ = [
    "ANSWER_RELEVANCY",
    "CORRECTNESS",
    "FAITHFULNESS",
    "JUDGED_METRICS",
    "Judge",
    "JudgeOutputError",
    "configure_deepeval",
    "tool_correctness",
]

log = logging.getLogger(__name__)

FAITHFULNESS: Final = "faithfulness"
"""Share of the answer's claims that the retrieved chunks support (DeepEval ``FaithfulnessMetric``)."""
ANSWER_RELEVANCY: Final = "answer_relevancy"
"""Share of the answer's statements that address the question (DeepEval ``AnswerRelevancyMetric``)."""
CORRECTNESS: Final = "correctness"
"""G-Eval rubric: the answer states the expected facts (or declines on an unanswerable case)."""
JUDGED_METRICS: Final = (FAITHFULNESS, ANSWER_RELEVANCY, CORRECTNESS)
"""The judged metrics, in report order."""

# --- DeepEval's environment ------------------------------------------------------------

_configured_dir: Path | None = None


def _default_work_dir() -> Path:
    # Only reached when nothing configured DeepEval (a deterministic `tools_match` in a
    # library call): a per-user cache directory, never the working tree.
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError:  # no home directory
            return Path(tempfile.gettempdir()) / f"switchyard-deepeval-{os.getuid()}"
    return Path(base) / "switchyard" / "deepeval"


def configure_deepeval(work_dir: Path) -> None:
    """Make DeepEval run offline, with its files under ``work_dir``; call before importing it.

    Sets, in this process's environment (DeepEval reads them from there):

    - ``DEEPEVAL_TELEMETRY_OPT_OUT=YES``: no PostHog events, no anonymous id file, and
      DeepEval skips moving stray ``.deepeval*`` files of the current directory at import.
    - ``DEEPEVAL_DISABLE_DOTENV=1``: DeepEval does not load ``.env`` files from the current
      directory into our environment at import.
    - ``DEEPEVAL_DISABLE_LEGACY_KEYFILE=1``: nor settings from a ``.deepeval/.deepeval``
      keystore (a provider, a Confident AI key, an eval mode set by ``deepeval set-...``).
    - ``DEEPEVAL_CACHE_FOLDER=<work_dir>/.deepeval`` (absolute): where DeepEval keeps
      everything it writes (test-run cache, latest run, keystore). DeepEval 4.3.1 reads
      it once, when ``deepeval.constants`` is imported (``HIDDEN_DIR``), and builds its
      file paths from it at import; left unset it is ``.deepeval`` relative to the
      current directory, i.e. the working tree. Hence "before importing".
    - ``DEEPEVAL_HOME=<work_dir>/.deepeval``: the per-machine state directory (telemetry
      id), ``~/.deepeval`` by default.
    - ``ENABLE_DEEPEVAL_CACHE=NO``: no test-run cache (``evaluate()``'s ``use_cache``
      default); our own calls (``a_measure``) never read or write it either.
    - ``DEEPEVAL_UPDATE_WARNING_OPT_IN=0``: no PyPI version check at import.
    - ``CONFIDENT_TRACING_ENABLED=NO``: DeepEval's tracing (which wraps every judge call)
      never starts its upload worker.
    - ``DEEPEVAL_EVAL_MODE=llm``: every decision is the judge's; other modes call Confident
      AI's hosted "System One" model.
    - ``CONFIDENT_API_KEY`` is removed: with no key DeepEval cannot log in to Confident AI
      or upload anything.

    Idempotent. The first call fixes the directory for the life of the process (DeepEval
    cannot move it once imported); a later call with another ``work_dir`` keeps it.

    Raises:
        RuntimeError: DeepEval was imported before any call, so it already writes to the
            current directory.
    """
    global _configured_dir
    if _configured_dir is not None:
        if work_dir.resolve() != _configured_dir.parent:
            log.debug("DeepEval already keeps its files in %s; not moving them to %s", _configured_dir, work_dir)
        return
    hidden = (work_dir.resolve() / ".deepeval").absolute()
    constants = sys.modules.get("deepeval.constants")
    if constants is not None and Path(constants.HIDDEN_DIR).absolute() != hidden:
        raise RuntimeError(
            f"deepeval was imported before configure_deepeval(): it keeps its files in "
            f"{constants.HIDDEN_DIR!r}; call configure_deepeval() before anything imports deepeval"
        )
    hidden.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        {
            "DEEPEVAL_TELEMETRY_OPT_OUT": "YES",
            "DEEPEVAL_DISABLE_DOTENV": "1",
            "DEEPEVAL_DISABLE_LEGACY_KEYFILE": "1",
            "DEEPEVAL_CACHE_FOLDER": str(hidden),
            "DEEPEVAL_HOME": str(hidden),
            "ENABLE_DEEPEVAL_CACHE": "NO",
            "DEEPEVAL_UPDATE_WARNING_OPT_IN": "0",
            "CONFIDENT_TRACING_ENABLED": "NO",
            "DEEPEVAL_EVAL_MODE": "llm",
        }
    )
    os.environ.pop("CONFIDENT_API_KEY", None)
    _configured_dir = hidden


def _ensure_configured() -> None:
    if _configured_dir is None:
        configure_deepeval(_default_work_dir())


# --- the judge as a DeepEval model -----------------------------------------------------


class JudgeOutputError(Exception):
    """The judge's answer is not the JSON the step asked for."""


_MAX_ITEMS: Final = 8
"""Longest list a judge may answer (claims, truths, statements, verdicts)."""
_MAX_CHARS: Final = 160
"""Longest string a judge may answer (one claim, one reason)."""


def _bounded(node: Any) -> Any:
    """A JSON schema with every array and string given an upper bound.

    A small model under a grammar can keep a list open until its token limit (SmolLM2
    wrote verdicts until the answer was cut mid-JSON); with bounds the grammar makes it
    close the JSON well before that (8 items of 160 characters fit in a 512-token answer).
    The price: an answer with more than eight claims or statements is judged on its first
    eight.
    """
    if isinstance(node, dict):
        out = {key: _bounded(value) for key, value in node.items()}
        if out.get("type") == "array":
            out.setdefault("maxItems", _MAX_ITEMS)
        elif out.get("type") == "string" and "enum" not in out:
            out.setdefault("maxLength", _MAX_CHARS)
        return out
    if isinstance(node, list):
        return [_bounded(item) for item in node]
    return node


def _json_schema_format(schema: type[BaseModel]) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": {"name": schema.__name__, "schema": _bounded(schema.model_json_schema()), "strict": False},
    }


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks
        return "".join(part if isinstance(part, str) else str(part.get("text", "")) for part in content)
    return str(content)


def _parse(schema: type[BaseModel], text: str) -> BaseModel:
    try:
        return schema.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or "answer"
        shown = text.strip().replace("\n", " ")
        shown = shown[:80] + ("…" if len(shown) > 80 else "")
        raise JudgeOutputError(
            f"unparseable JSON for {schema.__name__} ({where}: {first.get('msg', 'invalid')}): {shown!r}"
        ) from None


@functools.cache
def _chat_judge_class() -> type[DeepEvalBaseLLM]:
    """The `DeepEvalBaseLLM` adapter, defined on first use (after `configure_deepeval`)."""
    from deepeval.models import DeepEvalBaseLLM  # noqa: PLC0415 - DeepEval reads its env at import

    class ChatModelJudge(DeepEvalBaseLLM):
        """A LangChain chat model as DeepEval's evaluation model.

        With a pydantic ``schema`` (every DeepEval step that parses a verdict passes one),
        the backend is asked for JSON matching it and the parsed object is returned;
        an answer that does not parse raises `JudgeOutputError`.
        """

        def __init__(self, chat_model: BaseChatModel, name: str, *, json_schema: bool, max_tokens: int | None) -> None:
            self._chat = chat_model
            self._json_schema = json_schema
            self._params: dict[str, Any] = {"temperature": 0}
            if max_tokens is not None:
                self._params["max_tokens"] = max_tokens
            super().__init__(name)

        def load_model(self, *args: Any, **kwargs: Any) -> BaseChatModel:
            return self._chat

        def get_model_name(self, *args: Any, **kwargs: Any) -> str:
            return str(self.name)

        def supports_log_probs(self) -> bool:
            return False  # G-Eval then asks for its score as JSON

        def supports_structured_outputs(self) -> bool:
            return self._json_schema

        def _bound(self, schema: type[BaseModel] | None) -> Any:
            params = dict(self._params)
            if schema is not None and self._json_schema:
                params["response_format"] = _json_schema_format(schema)
            return self._chat.bind(**params)

        def generate(self, prompt: str, schema: type[BaseModel] | None = None, **_: Any) -> Any:
            text = _text(self._bound(schema).invoke([HumanMessage(prompt)]).content)
            return _parse(schema, text) if schema is not None else text

        async def a_generate(self, prompt: str, schema: type[BaseModel] | None = None, **_: Any) -> Any:
            text = _text((await self._bound(schema).ainvoke([HumanMessage(prompt)])).content)
            return _parse(schema, text) if schema is not None else text

        # The base class retries without the schema on any TypeError, hiding our own.
        def generate_with_schema(self, *args: Any, schema: Any = None, **kwargs: Any) -> Any:
            return self.generate(*args, schema=schema, **kwargs)

        async def a_generate_with_schema(self, *args: Any, schema: Any = None, **kwargs: Any) -> Any:
            return await self.a_generate(*args, schema=schema, **kwargs)

    return ChatModelJudge


# --- scoring ---------------------------------------------------------------------------

_CORRECTNESS_STEPS = [
    "Read the expected output: either facts the answer must state, or that the answer must say "
    "it has no relevant information.",
    "If facts are expected, check that the actual output states each of them; wording, number "
    "formatting, citation marks like [1] and the language of the answer may differ.",
    "Lower the score for each expected fact that is missing or contradicted, and for invented "
    "claims that contradict the expected output.",
    "If the expected output says the answer should have no relevant information, score high only "
    "when the actual output declines to answer and does not make up an answer.",
]


def _expected_output(case: Case) -> str | None:
    if case.expect_no_answer:
        return "The answer says that it has no relevant information (it does not know), and gives no made-up answer."
    if case.expected_facts:
        return "The answer states these facts: " + "; ".join(case.expected_facts)
    return None


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or exc.__class__.__name__
    text = text if isinstance(exc, JudgeOutputError) else f"{exc.__class__.__name__}: {text}"
    return text[:200] + ("…" if len(text) > 200 else "")


def _cause(exc: BaseException) -> BaseException:
    # DeepEval re-raises some errors wrapped; report the judge's own error when there is one.
    seen = exc
    while seen is not None:
        if isinstance(seen, JudgeOutputError):
            return seen
        seen = seen.__cause__ or seen.__context__  # type: ignore[assignment]
    return exc


class Judge:
    """Scores cases on the judged metrics with one judge model.

    Build it with `Judge.for_model`. Stateless between cases: each `score` builds fresh
    DeepEval metric objects (they keep per-measure state), so cases may be scored
    concurrently.
    """

    def __init__(self, llm: DeepEvalBaseLLM, name: str, *, timeout_s: float) -> None:
        self._llm = llm
        self.name = name
        """What the run file's ``judge`` says: the alias (or backend) judging."""
        self.timeout_s = timeout_s
        """Longest time one metric of one case may take; then it is a scored error."""

    @classmethod
    def for_model(
        cls,
        chat_model: BaseChatModel,
        name: str,
        *,
        json_schema: bool = True,
        max_tokens: int | None = None,
        timeout_s: float = 600.0,
    ) -> Judge:
        """A judge backed by a LangChain chat model.

        Args:
            chat_model: the judge, e.g. ``gateway.chat_model(alias)``; called at
                temperature 0.
            name: what the run file records as the judge (the alias).
            json_schema: ask for schema-constrained JSON (``response_format``
                ``json_schema``); turn off for a backend whose capabilities lack it (the
                gateway refuses such a request), then DeepEval's prompts alone ask for JSON.
            max_tokens: the limit of one judge answer; ``None`` keeps the backend's default.
            timeout_s: longest time for one metric of one case (two or three judge calls):
                SmolLM2 on two busy CPU cores needs about four minutes for a case.
        """
        _ensure_configured()
        llm = _chat_judge_class()(chat_model, name, json_schema=json_schema, max_tokens=max_tokens)
        return cls(llm, name, timeout_s=timeout_s)

    async def score(self, case: Case, output: CaseOutput) -> tuple[dict[str, float | None], dict[str, str]]:
        """Score one case's output on `JUDGED_METRICS`.

        Returns:
            ``(values, errors)``. ``values`` has every judged metric: a score in ``[0, 1]``,
            or ``None`` when the metric does not apply (``faithfulness`` without retrieved
            contexts or for an empty answer; ``correctness`` for a case with neither
            expected facts nor ``expect_no_answer``) or could not be scored; then
            ``errors[metric]`` says why (unparseable JSON, a timeout, a backend error, the
            run itself failed). Never raises for a judge's failure.
        """
        values: dict[str, float | None] = dict.fromkeys(JUDGED_METRICS)
        errors: dict[str, str] = {}
        if output.error is not None:
            return values, dict.fromkeys(JUDGED_METRICS, f"run failed: {output.error}"[:200])
        answer = output.answer.strip()
        expected = _expected_output(case)
        if not answer:
            # Nothing said: nothing to be faithful about, and neither relevant nor correct.
            values[ANSWER_RELEVANCY] = 0.0
            values[CORRECTNESS] = 0.0 if expected is not None else None
            return values, errors

        from deepeval.test_case import LLMTestCase  # noqa: PLC0415 - after configure_deepeval

        test_case = LLMTestCase(
            input=case.input,
            actual_output=output.answer,
            expected_output=expected,
            retrieval_context=list(output.contexts) or None,
        )
        metrics: dict[str, BaseMetric] = {}
        if output.contexts:
            metrics[FAITHFULNESS] = self._faithfulness()
        metrics[ANSWER_RELEVANCY] = self._answer_relevancy()
        if expected is not None:
            metrics[CORRECTNESS] = self._correctness()
        results = await asyncio.gather(*(self._measure(m, test_case) for m in metrics.values()))
        for metric, (value, error) in zip(metrics, results, strict=True):
            values[metric] = value
            if error is not None:
                errors[metric] = error
        return values, errors

    async def _measure(self, metric: BaseMetric, test_case: Any) -> tuple[float | None, str | None]:
        try:
            async with asyncio.timeout(self.timeout_s):
                score = await metric.a_measure(test_case, _show_indicator=False)
        except TimeoutError:
            return None, f"judge timed out after {self.timeout_s:g} s"
        except Exception as exc:  # the boundary: a judge's failure is a scored error, not a crash
            cause = _cause(exc)
            log.info("judge %s failed on %s: %s", self.name, metric.__name__, _short(cause))
            return None, _short(cause)
        if score is None or not 0.0 <= float(score) <= 1.0:
            return None, f"judge gave a score outside [0, 1]: {score!r}"
        return float(score), None

    def _faithfulness(self) -> BaseMetric:
        from deepeval.metrics import FaithfulnessMetric  # noqa: PLC0415

        return FaithfulnessMetric(model=self._llm, eval_mode="llm", include_reason=False, async_mode=True)

    def _answer_relevancy(self) -> BaseMetric:
        from deepeval.metrics import AnswerRelevancyMetric  # noqa: PLC0415

        return AnswerRelevancyMetric(model=self._llm, eval_mode="llm", include_reason=False, async_mode=True)

    def _correctness(self) -> BaseMetric:
        from deepeval.metrics import GEval  # noqa: PLC0415
        from deepeval.test_case import SingleTurnParams  # noqa: PLC0415

        # Steps given, so G-Eval does not ask the judge to write them (one call fewer, and
        # the same rubric in every run).
        return GEval(
            name="Correctness",
            evaluation_params=[SingleTurnParams.INPUT, SingleTurnParams.ACTUAL_OUTPUT, SingleTurnParams.EXPECTED_OUTPUT],
            evaluation_steps=_CORRECTNESS_STEPS,
            model=self._llm,
            async_mode=True,
        )


# --- tool correctness ------------------------------------------------------------------


def _canonical(value: Any) -> Any:
    """A value as tool arguments are compared: strings normalised (`eval.metrics.normalise`),
    numbers as floats, booleans tagged so that ``True`` is not ``1``."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return normalise(value)
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


@functools.cache
def _tool_metric_parts() -> tuple[Any, Any, Any, Any]:
    from deepeval.metrics import ToolCorrectnessMetric  # noqa: PLC0415
    from deepeval.models import DeepEvalBaseLLM  # noqa: PLC0415
    from deepeval.test_case import LLMTestCase, ToolCall, ToolCallParams  # noqa: PLC0415

    class NoModel(DeepEvalBaseLLM):
        """ToolCorrectnessMetric wants a model object, and builds an OpenAI client when
        given none; it calls it only to judge ``available_tools``, which we never pass."""

        def __init__(self) -> None:
            super().__init__("none")

        def load_model(self, *args: Any, **kwargs: Any) -> None:
            return None

        def generate(self, *args: Any, **kwargs: Any) -> str:
            raise RuntimeError("tool correctness is deterministic: no model may be called")

        async def a_generate(self, *args: Any, **kwargs: Any) -> str:
            raise RuntimeError("tool correctness is deterministic: no model may be called")

        def get_model_name(self, *args: Any, **kwargs: Any) -> str:
            return "none"

    def metric() -> Any:
        return ToolCorrectnessMetric(
            model=NoModel(),
            eval_mode="llm",
            evaluation_params=[ToolCallParams.INPUT_PARAMETERS],
            include_reason=False,
            async_mode=False,  # the sync path: callable from inside a running event loop
        )

    return metric, LLMTestCase, ToolCall, NoModel


def tool_correctness(expected: Sequence[Mapping[str, Any]], called: Sequence[Mapping[str, Any]]) -> float:
    """DeepEval's ``ToolCorrectnessMetric`` on one case's tool calls; deterministic.

    The metric's default matching (order ignored, extra calls not penalised), on names and
    input parameters. Each expected call takes the best remaining call of its name; its
    score is DeepEval's share of argument keys that agree (1 when all do, 0.5 when one of
    two does), and the case's score is the mean over expected calls.

    What we hand DeepEval, so that its comparison matches what ``expected_tools`` means:

    - An expected call's ``args`` are the arguments that matter: a call's arguments are
      cut down to the keys some expectation of that tool gives (an expectation with no
      ``args`` is met by the name alone; arguments nobody asked about are not extra).
    - Values are compared normalised (`_canonical`): strings as `eval.metrics.normalise`
      makes them, ``5`` equal to ``5.0``, ``True`` not equal to ``1``.
    - Expectations with ``args`` are matched first, so a name-only expectation does not
      take the call they need.
    - Each call carries its position as its ``output`` (not compared: only input
      parameters are evaluated), because DeepEval remembers matched calls in a set, where
      two identical calls would be one.

    Args:
        expected: the case's ``expected_tools``, ``{"name", "args"}`` each.
        called: the calls the run made, ``{"name", "args"}`` each.

    Returns:
        A fraction in ``[0, 1]``. With nothing expected: 1 when nothing was called, else 0.
    """
    _ensure_configured()
    make_metric, llm_test_case, tool_call, _ = _tool_metric_parts()
    keys: dict[str, set[str]] = {}
    for want in expected:
        keys.setdefault(str(want.get("name")), set()).update((want.get("args") or {}).keys())
    expected_calls = [
        tool_call(name=str(want.get("name")), input_parameters=_canonical(dict(want.get("args") or {})))
        for want in sorted(expected, key=lambda e: not e.get("args"))
    ]
    called_calls = []
    for position, call in enumerate(called):
        name = str(call.get("name"))
        relevant = keys.get(name, set())
        args = {k: v for k, v in (call.get("args") or {}).items() if k in relevant}
        called_calls.append(tool_call(name=name, input_parameters=_canonical(args), output=f"call #{position}"))
    test_case = llm_test_case(input="(tool calls)", actual_output="", tools_called=called_calls, expected_tools=expected_calls)
    metric = make_metric()
    return float(metric.measure(test_case, _show_indicator=False))
