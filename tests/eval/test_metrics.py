"""The deterministic metrics on hand-made cases: English, Chinese, full-width text,
thousands separators, empty inputs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from eval.metrics import (
    NO_ANSWER_MARKERS,
    CaseScore,
    LatencySla,
    aggregate,
    cited_indices,
    citations_valid,
    error_counts,
    facts_contained,
    latency_within,
    mrr,
    no_answer_detected,
    normalise,
    recall_at_k,
    tools_match,
)
from graphs.rag.prompts import NO_ANSWER_TEXT


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,234,567", "1234567"),
        ("1 234", "1234"),
        ("１，２３４", "1234"),  # full-width digits and comma
        ("１２３４", "1234"),
        ("1\u00a0234 and 1\u202f234", "1234 and 1234"),  # no-break and narrow no-break spaces
        ("1,234.5", "1234.5"),  # the decimal part stays
        ("Ｈｅｌｌｏ　ＷＯＲＬＤ", "hello world"),  # full-width letters, ideographic space
        ("  many \n\t spaces  ", "many spaces"),
        ("Straße", "strasse"),  # casefold, not lower
        ("don’t", "don't"),
        ("共有 1,234 人", "共有 1234 人"),
        ("", ""),
        # Not thousands groupings: left as they are.
        ("1,2,3", "1,2,3"),
        ("in 2024 123 people", "in 2024 123 people"),
        ("1,234,56", "1,234,56"),
        ("0.123 456", "0.123 456"),
        ("3, 456", "3, 456"),
    ],
)
def test_normalise(text: str, expected: str) -> None:
    assert normalise(text) == expected


def test_recall_at_k() -> None:
    assert recall_at_k(["a", "b", "c"], ["a", "c"], k=3) == 1.0
    assert recall_at_k(["a", "b", "c"], ["a", "c"], k=2) == 0.5
    assert recall_at_k(["x", "y"], ["a"], k=5) == 0.0
    assert recall_at_k(["a", "a", "b"], ["a", "b"], k=2) == 0.5  # a duplicate takes its position
    assert recall_at_k(["a"], ["a", "a"], k=1) == 1.0  # expected ids count once
    assert recall_at_k([], ["a"], k=3) == 0.0
    assert recall_at_k(["a"], [], k=3) is None  # nothing expected: does not apply
    with pytest.raises(ValueError, match="k must be positive"):
        recall_at_k(["a"], ["a"], k=0)


def test_mrr() -> None:
    assert mrr(["a", "b"], ["a"]) == 1.0
    assert mrr(["x", "y", "b"], ["b", "y"]) == 0.5
    assert mrr(["x", "y", "z"], ["b"]) == 0.0
    assert mrr([], ["b"]) == 0.0
    assert mrr(["a"], []) is None


def test_facts_contained_english_and_numbers() -> None:
    answer = "The Eiffel Tower is 330 m tall and had 6,207,303 visitors in 2019 [1]."
    assert facts_contained(answer, ["eiffel tower", "6207303", "330 M"]) == 1.0
    assert facts_contained(answer, ["6 207 303", "Louvre"]) == 0.5
    assert facts_contained("", ["anything"]) == 0.0
    assert facts_contained(answer, []) is None
    assert facts_contained(answer, ["", "   "]) is None  # empty facts are ignored


def test_facts_contained_chinese_and_full_width() -> None:
    answer = "根据资料，２０２３年公司营收为１，２３４万元，员工 5 000 人【1】。"
    assert facts_contained(answer, ["2023年", "1234万元", "5000 人"]) == 1.0
    assert facts_contained(answer, ["营收", "利润"]) == 0.5
    assert facts_contained("ＡＢＣ公司", ["abc公司"]) == 1.0


def test_cited_indices() -> None:
    assert cited_indices("Paris [1], see also [3][1] and [2, 4].") == [1, 3, 2, 4]
    assert cited_indices("答案见【2】和［5］，以及[1、3]。") == [2, 5, 1, 3]
    assert cited_indices("no citation, an array a[i] or [x]") == []
    assert cited_indices("") == []


def test_citations_valid() -> None:
    sources = [
        {"index": 1, "doc_id": "doc-a", "chunk_id": "a#0"},
        {"index": 2, "doc_id": "doc-b", "chunk_id": "b#3"},
    ]
    assert citations_valid([1, 2], sources) == 1.0
    assert citations_valid([1, 7], sources) == 0.5  # [7] points at nothing
    assert citations_valid([1, 1, 1, 7], sources) == 0.5  # repeats count once
    assert citations_valid(["doc-b", "a#0", "doc-z"], sources) == pytest.approx(2 / 3)
    assert citations_valid([2, 3], ["doc-a", "doc-b"]) == 0.5  # plain ids: [n] is the n-th
    assert citations_valid(["doc-a"], ["doc-a", "doc-b"]) == 1.0
    assert citations_valid([], sources) == 0.0  # sources were there, nothing cited
    assert citations_valid([], []) is None  # nothing to cite
    assert citations_valid([1], []) == 0.0
    assert citations_valid(cited_indices("巴黎【1】［2］"), sources) == 1.0


def test_no_answer_detected_matches_the_rag_graph() -> None:
    # The rag graph's own words when nothing passes grading.
    assert no_answer_detected(NO_ANSWER_TEXT.format(collection="docs"))
    # What its answer prompt asks the model to say, in English and Chinese, any width or case.
    assert no_answer_detected("I do not know: the sources do not say.")
    assert no_answer_detected("Sorry, I DON’T KNOW.")
    assert no_answer_detected("抱歉，我不知道。")
    assert no_answer_detected("资料中没有提到这个问题，无法回答。")
    assert no_answer_detected("ｉ　ｄｏ　ｎｏｔ　ｋｎｏｗ")
    # Answers are not no-answers; an empty answer says nothing.
    assert not no_answer_detected("The capital of France is Paris [1].")
    assert not no_answer_detected("法国的首都是巴黎【1】。")
    assert not no_answer_detected("")
    assert not no_answer_detected("   ")
    # Own markers replace the defaults.
    assert no_answer_detected("N/A", markers=["n/a"])
    assert not no_answer_detected("I do not know", markers=["n/a"])
    assert not no_answer_detected("anything", markers=["", " "])
    assert all(normalise(m) for m in NO_ANSWER_MARKERS)


def test_tools_match() -> None:
    calc = {"name": "calculator", "args": {"expression": "2+2"}}
    assert tools_match([calc], [{"name": "calculator", "args": {"expression": "2+2"}}]) == 1.0
    assert tools_match([calc], [{"name": "calculator", "args": {"expression": "3+3"}}]) == 0.0
    assert tools_match([calc], [{"name": "http_get", "args": {"expression": "2+2"}}]) == 0.0
    # Expected args are a subset of the call's; strings compare normalised, numbers numerically.
    assert tools_match(
        [{"name": "search", "args": {"query": "ＰＡＲＩＳ", "k": 5}}],
        [{"name": "search", "args": {"query": "paris", "k": 5.0, "extra": True}}],
    ) == 1.0
    # No args expected: the name is enough.
    assert tools_match([{"name": "calculator"}], [{"name": "calculator", "args": {"expression": "1"}}]) == 1.0
    # Each call matches one expectation; the specific one is served first.
    assert tools_match([{"name": "calculator"}, calc], [{"name": "calculator", "args": {"expression": "2+2"}}]) == 0.5
    assert tools_match([{"name": "calculator"}, calc], [calc, {"name": "calculator", "args": {}}]) == 1.0
    # Extra calls are not penalised; missing ones are.
    assert tools_match([calc], [{"name": "http_get"}, calc]) == 1.0
    assert tools_match([calc, {"name": "http_get"}], []) == 0.0
    # Nothing expected: nothing must be called.
    assert tools_match([], []) == 1.0
    assert tools_match([], [calc]) == 0.0
    assert tools_match([{"name": "t", "args": {"flag": True}}], [{"name": "t", "args": {"flag": 1}}]) == 0.0
    # Scored by DeepEval's ToolCorrectnessMetric: partial credit for the share of expected
    # argument keys that agree, and identical calls count as distinct calls.
    assert tools_match(
        [{"name": "search", "args": {"query": "paris", "k": 5}}],
        [{"name": "search", "args": {"query": "PARIS", "k": 6}}],
    ) == 0.5
    assert tools_match([calc, calc], [calc, calc]) == 1.0
    assert tools_match([calc, calc], [calc]) == 0.5


def test_latency_within() -> None:
    sla = LatencySla(ttft_s=1.0, total_s=10.0)
    assert latency_within(0.5, 8.0, sla)
    assert latency_within(1.0, 10.0, sla)  # the bound itself is within
    assert not latency_within(1.5, 8.0, sla)
    assert not latency_within(0.5, 12.0, sla)
    assert not latency_within(None, 1.0, sla)  # no first token came
    assert latency_within(None, 3.0, LatencySla(total_s=5.0))  # ttft not promised
    assert latency_within(None, None, LatencySla())


def test_case_score_and_aggregate() -> None:
    scores = [
        CaseScore(case_id="a", values={"facts_contained": 1.0, "recall_at_k": 0.5, "tools_match": None}),
        CaseScore(case_id="b", values={"facts_contained": 0.5, "recall_at_k": None}),
        CaseScore(
            case_id="c",
            values={"facts_contained": None, "faithfulness": None},
            errors={"faithfulness": "judge returned unparseable JSON"},
        ),
    ]
    assert aggregate(scores) == {"facts_contained": 0.75, "recall_at_k": 0.5, "tools_match": None, "faithfulness": None}
    assert error_counts(scores) == {"faithfulness": 1}
    assert aggregate([]) == {}
    # A run file round-trips.
    again = CaseScore.model_validate_json(scores[2].model_dump_json())
    assert again == scores[2]
    assert again.value("faithfulness") is None and again.value("absent") is None


def test_case_score_rejects_bad_values() -> None:
    with pytest.raises(ValidationError, match="not a finite number"):
        CaseScore(case_id="a", values={"mrr": float("nan")})
    with pytest.raises(ValidationError, match="case_id"):
        CaseScore(case_id="", values={})
    with pytest.raises(ValidationError, match="extra"):
        CaseScore.model_validate({"case_id": "a", "value": {}})
