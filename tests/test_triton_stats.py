"""Triton's statistics answer read as Triton writes it: a table of the ways one value is written, each row
with the right value asserted exactly (integers as ints, means from the integers)."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from inferwatch.exporters.triton.answers import decode_json
from inferwatch.exporters.triton.stats import (
    INFERENCE_STATS,
    BadValue,
    DurationStat,
    exact_int,
    parse_stats,
)

BIG = 2 ** 53 + 1  # 9007199254740993: the first integer a float64 cannot hold


def _stats(text: str):
    """Decode as the reader does (decode_json) and parse; returns ({key: ModelStats}, problems)."""
    return parse_stats(decode_json(text))


def _one(inference_stats: str, extra: str = "") -> object:
    stats, problems = _stats('{"model_stats": [{"name": "m", "version": "1", "inference_stats": '
                             + inference_stats + extra + "}]}")
    assert problems == []
    return stats[("m", "1")]


# The issue's row first: 64-bit values as strings, a zero field as {}, no batch_stats, ns above 2^53.
ISSUE_ROW = '{"success":{"count":"7","ns":"9007199254740993"},"fail":{},"queue":{"count":"7","ns":"700000"}}'


def test_issue_example_success_7_fail_0_mean_queue_100_us():
    st = _one(ISSUE_ROW)
    assert st.inference["success"] == DurationStat(7, BIG)  # exact, not 9007199254740992
    assert st.inference["fail"] == DurationStat(0, 0)
    assert st.inference["queue"].mean_seconds() == 100e-6
    assert st.batches == {} and st.execution_count == 0 and st.inference_count == 0
    # Every field of inference_stats is present, the ones Triton left out read as 0.
    assert set(st.inference) == set(INFERENCE_STATS)
    assert st.inference["compute_infer"] == DurationStat(0, 0)
    assert st.inference["compute_infer"].mean_seconds() is None  # no count: unknown, not 0


@pytest.mark.parametrize("written, count, ns", [
    # HTTP frontend: JSON numbers
    ('{"queue": {"count": 7, "ns": 700000}}', 7, 700000),
    # protobuf JSON mapping of uint64: decimal strings
    ('{"queue": {"count": "7", "ns": "700000"}}', 7, 700000),
    # a number the way some JSON writers print an integral double
    ('{"queue": {"count": 7.0, "ns": 7e5}}', 7, 700000),
    # above 2^53 as a number and as a string
    (f'{{"queue": {{"count": 3, "ns": {BIG}}}}}', 3, BIG),
    (f'{{"queue": {{"count": "3", "ns": "{BIG}"}}}}', 3, BIG),
    # the largest uint64
    ('{"queue": {"count": "18446744073709551615", "ns": 1}}', 2 ** 64 - 1, 1),
    # zero values left out: a field without ns, an empty object, a null
    ('{"queue": {"count": 2}}', 2, 0),
    ('{"queue": {}}', 0, 0),
    ('{"queue": null}', 0, 0),
    ('{}', 0, 0),
])
def test_one_duration_written_every_way(written, count, ns):
    st = _one(written)
    assert st.inference["queue"] == DurationStat(count, ns)
    assert type(st.inference["queue"].count) is int and type(st.inference["queue"].ns) is int
    if count:
        # The mean from the exact integers, rounded once; the test computes it independently with Fraction.
        assert st.inference["queue"].mean_seconds() == float(Fraction(ns, count * 10 ** 9))


def test_mean_is_computed_before_any_float():
    # 3 requests, 2^53 + 1 ns in total: the float route (float(ns) / count / 1e9) loses the +1 and rounds three
    # times: 3002399.7515803305 s; from the integers, rounded once: 3002399.751580331 s.
    exact = DurationStat(3, BIG).mean_seconds()
    assert exact == float(Fraction(BIG, 3 * 10 ** 9)) == 3002399.751580331
    assert exact != float(BIG) / 3 / 1e9


def test_protobuf_json_names_and_batch_stats_as_strings():
    text = json.dumps({"modelStats": [{
        "name": "classifier", "version": "2", "inferenceCount": "64", "executionCount": "13",
        "inferenceStats": {"success": {"count": "64", "ns": "568006643"}, "computeInfer": {"count": "64",
                                                                                           "ns": "194221389"}},
        "batchStats": [{"batchSize": "8", "computeInfer": {"count": "4", "ns": "2955923"}},
                       {"batchSize": "2", "computeInput": {"count": "3"}}]}]})
    stats, problems = _stats(text)
    st = stats[("classifier", "2")]
    assert problems == []
    assert (st.inference_count, st.execution_count) == (64, 13)
    assert st.inference["compute_infer"] == DurationStat(64, 194221389)
    assert st.batches[8]["compute_infer"] == DurationStat(4, 2955923)
    assert st.batches[2]["compute_infer"] == DurationStat(0, 0)  # left out: zero executions recorded there
    assert st.executions_by_batch_size() == {8: 4, 2: 0}


def test_a_real_2_51_answer():
    """The classifier answer captured from tritonserver 2.51 (benchmarks/data/triton_capture.json)."""
    from pathlib import Path

    capture = json.loads((Path(__file__).parents[1] / "benchmarks/data/triton_capture.json").read_text())
    stats, problems = _stats(json.dumps({"model_stats": [capture["model_stat"]]}))
    st = stats[("classifier", "2")]
    assert problems == []
    assert st.inference["success"] == DurationStat(64, 568006643)
    assert st.inference["queue"] == DurationStat(64, 335168064)
    assert sum(size * n for size, n in st.executions_by_batch_size().items()) == 64  # every row executed once
    assert sum(st.executions_by_batch_size().values()) == st.execution_count == 13


@pytest.mark.parametrize("bad", ['"-1"', "-1", '"7.5"', "7.5", '"abc"', '""', "true", f'"{2 ** 64}"', "[1]",
                                 '"1e400000"'])
def test_impossible_values_drop_that_model_only(bad):
    text = ('{"model_stats": [{"name": "bad", "version": "1", "inference_stats": {"fail": {"count": ' + bad
            + '}}}, {"name": "good", "version": "1", "inference_stats": ' + ISSUE_ROW + "}]}")
    stats, problems = _stats(text)
    assert list(stats) == [("good", "1")]
    assert len(problems) == 1 and problems[0][0] == "bad"
    assert problems[0][1].startswith("'bad' version '1': fail.count")


@pytest.mark.parametrize("answer", ["[]", '{"model_stats": {}}', '"x"'])
def test_wrong_shapes_are_value_errors(answer):
    with pytest.raises(ValueError):
        _stats(answer)


def test_entry_without_name_is_a_problem_not_a_crash():
    stats, problems = _stats('{"model_stats": [{"version": "1"}, {"name": "", "version": "1"}, '
                             '{"name": "m", "version": "1"}]}')
    assert list(stats) == [("m", "1")]
    assert problems == [("", "model_stats entry without a name")] * 2


@pytest.mark.parametrize("value, expected", [(7, 7), ("7", 7), (" 7 ", 7), (7.0, 7), ("1e3", 1000), (BIG, BIG),
                                             (str(BIG), BIG)])
def test_exact_int_accepts(value, expected):
    assert exact_int(value, "x") == expected


@pytest.mark.parametrize("value", [-1, "-1", 7.5, "0x10", None, True, 2 ** 64, float("nan"), {}])
def test_exact_int_refuses(value):
    with pytest.raises(BadValue):
        exact_int(value, "x")


def test_decode_json_never_makes_a_float_and_refuses_nan():
    doc = decode_json(f'{{"a": {BIG}, "b": 9.007199254740993e15, "c": 1.5}}')
    assert doc["a"] == BIG and type(doc["a"]) is int
    assert exact_int(doc["b"], "b") == BIG  # written with an exponent: exact through Decimal
    assert str(doc["c"]) == "1.5"
    with pytest.raises(ValueError):
        decode_json('{"a": NaN}')


@pytest.mark.parametrize("body", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000])
def test_decode_json_refuses_nesting_too_deep_as_malformed(body):
    # ValueError is the reader's bad_response; a RecursionError was counted as cause "other".
    with pytest.raises(ValueError, match="nested too deeply"):
        decode_json(body)
