"""The benchmark harness's pure helpers (nothing here times anything or starts a server)."""

from __future__ import annotations

import base64
import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from bench.decision_codes import Inputs
from bench.decision_codes_build import QWEN3_0_6B, Shape, layers_that_fit, parse_meminfo, token_rows
from bench.decisions import PACKAGE, Target, batch_request, load_in_process, reference_probabilities
from bench.harness.answers import answer_probabilities, max_abs_diff, response_probabilities
from bench.harness.clients import LeanClient
from bench.harness.report import (
    Table,
    cpu_busy_seconds,
    fmt_ms,
    fmt_ratio,
    format_table,
    record,
    render_run,
)
from bench.harness.runners import cosines, decode_embeddings
from bench.harness.server import parse_proc_status
from bench.harness.server_timing import parse_server_timing
from bench.harness.stats import median, percentile, ratio, summarize
from bench.harness.texts import decision_requests, fit_words, long_text, sentences
from edge_runtime.engine.cpu import INT8_FLAGS, cpu_class, cpu_flags, cpu_model

ROOT = Path(__file__).resolve().parent.parent


# -- stats --------------------------------------------------------------------------------------------

def test_median_odd_even_and_empty() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_percentile_interpolates_linearly() -> None:
    values = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert percentile(values, 0) == 10.0
    assert percentile(values, 50) == 30.0
    assert percentile(values, 100) == 50.0
    assert percentile(values, 90) == pytest.approx(46.0)
    assert percentile([7.0], 90) == 7.0
    with pytest.raises(ValueError):
        percentile(values, 101)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_ratio_guards_zero_and_non_finite() -> None:
    assert ratio(10.0, 4.0) == 2.5
    assert ratio(1.0, 0.0) is None
    assert ratio(float("nan"), 1.0) is None
    assert ratio(1.0, float("inf")) is None


def test_summarize_pools_samples_and_keeps_the_round_range() -> None:
    s = summarize([[1.0, 2.0, 3.0], [10.0, 11.0, 12.0], [4.0, 5.0, 6.0]])
    assert s.samples == 9
    assert s.median == 5.0
    assert (s.round_low, s.round_high) == (2.0, 11.0)
    assert s.p90 == pytest.approx(percentile([1, 2, 3, 4, 5, 6, 10, 11, 12], 90))


# -- Server-Timing ------------------------------------------------------------------------------------

def test_parse_server_timing_reads_every_phase() -> None:
    header = ("parse;dur=0.041, tokenize;dur=0.120, queue;dur=0.010, forward;dur=1.803, post;dur=0.070, "
              "serialize;dur=0.015, total;dur=2.210")
    timing = parse_server_timing(header)
    assert list(timing) == ["parse", "tokenize", "queue", "forward", "post", "serialize", "total"]
    assert timing["forward"] == 1.803
    assert timing["total"] - timing["forward"] == pytest.approx(0.407)


def test_parse_server_timing_tolerates_desc_quotes_and_missing_dur() -> None:
    timing = parse_server_timing('cache;desc="hit", db;dur="53.2";desc=x ,  app ; DUR = 7 ,,')
    assert timing == {"db": 53.2, "app": 7.0}
    assert parse_server_timing("") == {}


def test_parse_server_timing_rejects_a_bad_duration() -> None:
    with pytest.raises(ValueError, match="forward"):
        parse_server_timing("forward;dur=fast")


# -- tables and conditions ----------------------------------------------------------------------------

def test_format_table_pads_columns_and_escapes_pipes() -> None:
    text = format_table(["name", "ms"], [["a|b", "1.00"], ["longer name", "12.50"]])
    lines = text.splitlines()
    assert lines[0] == "| name        | ms    |"
    assert lines[1] == "|-------------|-------|"
    assert lines[2] == "| a\\|b        | 1.00  |"
    assert lines[3] == "| longer name | 12.50 |"
    assert len({len(line) for line in lines}) == 1


def test_format_table_refuses_ragged_rows() -> None:
    with pytest.raises(ValueError):
        format_table(["a", "b"], [["only one"]])
    with pytest.raises(ValueError):
        format_table([], [])


def test_number_formats() -> None:
    assert fmt_ms(0.0031234) == "3.12"
    assert fmt_ms(0.0790, 1) == "79.0"
    assert fmt_ms(None) == "–"
    assert fmt_ratio(2.4149) == "2.41x"
    assert fmt_ratio(None) == "–"


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse avx2 avx512f avx512_vnni avx512_bf16

processor\t: 1
model name\t: AMD EPYC 9R14 96-Core Processor
"""


def test_cpu_model_and_flags_from_cpuinfo() -> None:
    assert cpu_model(CPUINFO) == "AMD EPYC 9R14 96-Core Processor"
    assert cpu_model("processor : 0\nHardware : BCM2835\nModel : Raspberry Pi 4\n") == "BCM2835"
    assert cpu_model("") is None
    assert cpu_flags(CPUINFO) == ["avx2", "avx512f", "avx512_vnni", "avx512_bf16"]
    assert cpu_flags("") == []
    arm = "processor : 0\nFeatures : fp asimd asimddp i8mm\nHardware : Neoverse\n"
    assert cpu_flags(arm, INT8_FLAGS) == ["asimddp", "i8mm"]
    assert cpu_flags(CPUINFO, INT8_FLAGS) == ["avx2", "avx512_vnni"]
    here = cpu_class()
    assert here["model"] and set(here["int8_instructions"]) <= set(INT8_FLAGS)


def test_parse_proc_status_converts_kb_to_bytes() -> None:
    text = "Name:\tpython\nVmPeak:\t  500 kB\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t 10 kB\nThreads:\t5\n"
    assert parse_proc_status(text) == {"VmPeak": 512000, "VmHWM": 2097152, "VmRSS": 1048576, "RssAnon": 10240}


def test_render_and_record_append_dated_runs(tmp_path: Path) -> None:
    table = Table("Latency", ["contestant", "ms"], [["ours", "1.00"]], ["a note"])
    conds = {"date": "2026-12-02 13:00 UTC", "machine": "nproc 2", "threads": "2"}
    text = render_run("python -m bench all", conds, [table])
    assert text.startswith("## 2026-12-02 13:00 UTC: `python -m bench all`\n")
    assert "- machine: nproc 2" in text and "- date:" not in text
    assert "### Latency" in text and "| ours       | 1.00 |" in text and "- a note" in text
    doc = tmp_path / "benchmarks.md"
    record(text, doc)
    record(text.replace("13:00", "14:00"), doc)
    content = doc.read_text(encoding="utf-8")
    assert content.startswith("# Benchmarks\n")
    assert content.count("# Benchmarks") == 1
    assert content.index("13:00 UTC") < content.index("14:00 UTC")


# -- inputs and decoding ------------------------------------------------------------------------------

def test_sentences_are_deterministic_distinct_and_about_twenty_words() -> None:
    a, b = sentences(32, seed=11), sentences(32, seed=11)
    assert a == b and len(set(a)) == 32
    assert sentences(32, seed=12) != a
    assert all(15 <= len(s.split()) <= 25 for s in a)


def test_long_text_has_the_exact_size_in_bytes() -> None:
    text = long_text(5 * 1024 * 1024)
    assert len(text.encode("utf-8")) == 5 * 1024 * 1024 == len(text)
    with pytest.raises(ValueError):
        long_text(0)


def test_decode_embeddings_float_and_base64_agree_and_keep_order() -> None:
    rows = np.array([[0.6, 0.8], [1.0, 0.0]], dtype=np.float32)
    as_float = {"data": [{"index": 1, "embedding": rows[1].tolist()}, {"index": 0, "embedding": rows[0].tolist()}]}
    as_b64 = {"data": [{"index": i, "embedding": base64.b64encode(r.astype("<f4").tobytes()).decode()}
                       for i, r in enumerate(rows)]}
    np.testing.assert_array_equal(decode_embeddings(as_float, "float"), rows)
    np.testing.assert_array_equal(decode_embeddings(as_b64, "base64"), rows)
    with pytest.raises(RuntimeError, match="max_length_exceeded"):
        decode_embeddings({"data": [{"index": 0, "embedding": None,
                                     "error": {"code": "max_length_exceeded"}}]}, "float")


def test_cosines_row_wise() -> None:
    a = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    b = np.array([[2.0, 0.0], [1.0, 1.0]], dtype=np.float32)
    np.testing.assert_allclose(cosines(a, b), [1.0, np.sqrt(0.5)])
    with pytest.raises(ValueError):
        cosines(a, b[:1])


def test_the_harness_process_never_imports_torch() -> None:
    # Pitfall P6: torch's OpenMP threads in the harness would steal the cores from every contestant.
    code = ("import sys, bench.__main__, bench.embeddings, bench.overhead, bench.longinput; "
            "sys.exit(1 if 'torch' in sys.modules or 'onnxruntime' in sys.modules else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_cpu_busy_seconds_counts_work_not_idle() -> None:
    stat = "cpu  100 20 30 1000 50 5 5 10 0 0\ncpu0 50 10 15 500 25 2 3 5 0 0\nintr 1 2 3\n"
    assert cpu_busy_seconds(stat, 100) == pytest.approx((100 + 20 + 30 + 5 + 5 + 10) / 100)
    with pytest.raises(ValueError):
        cpu_busy_seconds("intr 1 2 3\n", 100)


# -- decision benchmarks ------------------------------------------------------------------------------

def test_decision_requests_are_deterministic_and_ask_a_choice_a_noul_and_a_score() -> None:
    a, b = decision_requests(12, seed=3), decision_requests(12, seed=3)
    assert a == b and a != decision_requests(12, seed=4)
    assert len({r["state"] for r in a}) == 12
    for r in a:
        kinds = {q["type"] for q in r["questions"].values()}
        assert kinds == {"choice", "noul", "score"}
        qs = r["questions"]
        assert isinstance(qs["route"]["criteria"], dict) and len(qs["route"]["criteria"]) >= 2
        assert isinstance(qs["level"]["criteria"], list) and 2 <= len(qs["level"]["criteria"]) <= 10
        assert 1 <= r["state"].count(".") <= 3


def test_target_body_adds_only_our_model_member() -> None:
    request = {"state": "s", "questions": {"q": {"type": "noul", "instructions": "i"}}}
    ours = json.loads(Target("ours", 1, "/v1/decisions", "sparrow-nano").body(request))
    theirs = json.loads(Target("theirs", 1, "/v1/systemone", None).body(request))
    assert theirs == request
    assert ours == {"model": "sparrow-nano", **request}


def test_batch_requests_take_the_standard_form_for_one_state_and_states_for_more() -> None:
    requests = decision_requests(5, seed=3)
    assert batch_request(requests, 1, offset=2) == requests[2]
    batch = batch_request(requests, 3, offset=4)
    assert batch == {"states": {"s0": requests[4], "s1": requests[0], "s2": requests[1]}}
    from edge_runtime.api.schema import request_validator

    validator = request_validator("/v1/decisions")
    for body in (batch_request(requests, 1), batch):
        validator.validate({"model": PACKAGE, **body})


def test_the_in_process_worker_answers_without_http_and_runs_the_forward_alone(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    from converters.sparrow.export import build_sparrow_package
    from edge_runtime.work import offloaded

    answer = load_in_process(build_sparrow_package(tmp_path_factory.mktemp("bench-sparrow")), 1)
    requests = decision_requests(4, seed=3)
    for states in (1, 3):
        body = json.dumps({"model": PACKAGE, **batch_request(requests, states)})
        got = answer({"stage": "answer", "body": body})
        assert answer({"stage": "forward", "body": body}) == {"rows": 3 * states}
        entries = [got] if states == 1 else [got["states"][f"s{i}"] for i in range(states)]
        for entry in entries:
            assert {q: a["type"] for q, a in entry["answers"].items()} == {
                "route": "choice", "flag": "noul", "level": "score"}
        assert got["model"] == PACKAGE and got["usage"]["input_tokens"] > 0
    assert offloaded()  # the body size it answered for stayed in its own task: this thread's default holds


def test_answer_probabilities_by_question_type() -> None:
    assert answer_probabilities({"type": "noul", "noul": 0.25}) == {"true": 0.25}
    assert answer_probabilities({"type": "choice", "choice": "a", "probabilities": {"a": 0.7, "b": 0.3}}) == \
        {"a": 0.7, "b": 0.3}
    assert answer_probabilities({"type": "score", "score": 0.4, "probabilities": {"0": 0.6, "1": 0.4}}) == \
        {"0": 0.6, "1": 0.4}
    with pytest.raises(ValueError):
        answer_probabilities({"type": "choice", "error": "invalid_question"})


def test_max_abs_diff_and_its_shape_checks() -> None:
    a = {"q": {"x": 0.5, "y": 0.5}, "n": {"true": 0.1}}
    b = {"q": {"x": 0.4, "y": 0.6}, "n": {"true": 0.1}}
    assert max_abs_diff(a, b) == pytest.approx(0.1)
    assert max_abs_diff(a, a) == 0.0
    with pytest.raises(ValueError, match="questions"):
        max_abs_diff(a, {"q": a["q"]})
    with pytest.raises(ValueError, match="options"):
        max_abs_diff(a, {"q": {"x": 1.0}, "n": {"true": 0.1}})


def test_response_and_reference_probabilities_key_alike() -> None:
    request = {"state": "s", "questions": {"c": {"type": "choice", "criteria": {"a": None, "b": None}},
                                           "n": {"type": "noul"}, "l": {"type": "score", "criteria": ["lo", "hi"]}}}

    class FakeDecider:
        def probs(self, state, q):  # the shape of sparrow_decider.Decider.probs
            names = {"choice": ["a", "b"], "noul": ["false", "true"], "score": ["0", "1"]}[q["type"]]
            return q["type"], names, ["", ""], np.array([0.25, 0.75])

    ref = reference_probabilities(FakeDecider(), request)
    assert ref == {"c": {"a": 0.25, "b": 0.75}, "n": {"true": 0.75}, "l": {"0": 0.25, "1": 0.75}}
    body = {"answers": {"c": {"type": "choice", "choice": "b", "probabilities": {"a": 0.25, "b": 0.75}},
                        "n": {"type": "noul", "noul": 0.75},
                        "l": {"type": "score", "score": 0.75, "probabilities": {"0": 0.25, "1": 0.75}}}}
    assert max_abs_diff(response_probabilities(body), ref) == 0.0
    with pytest.raises(ValueError):
        response_probabilities({"error": {"code": "invalid_request"}})


def test_qwen3_shape_counts_the_published_non_embedding_parameters() -> None:
    # Qwen3-0.6B's model card: 0.44B parameters without the embedding.
    assert 0.43e9 < QWEN3_0_6B.backbone_parameters() < 0.45e9
    half = Shape(num_hidden_layers=14)
    assert half.backbone_parameters() * 2 == QWEN3_0_6B.backbone_parameters()


def test_parse_meminfo_and_layers_that_fit() -> None:
    info = parse_meminfo("MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\nHugePages_Total:       0\n")
    assert info == {"MemTotal": 24_000_000 * 1024, "MemAvailable": 20_000_000 * 1024, "HugePages_Total": 0}
    per_layer_bytes = 4 * QWEN3_0_6B.backbone_parameters() / 28
    margin = 2 * 1024**3
    assert layers_that_fit(margin + int(per_layer_bytes * 6 * 10.5), QWEN3_0_6B, 6.0, margin) == 10
    assert layers_that_fit(10**15, QWEN3_0_6B, 6.0, margin) == 28
    assert layers_that_fit(margin, QWEN3_0_6B, 6.0, margin) == 0


def test_fit_words_takes_the_prefix_closest_to_the_target() -> None:
    words = ["aa", "b", "cccc", "dd", "e"]
    chars = lambda text: len(text.replace(" ", ""))  # noqa: E731 - counts 2, 3, 7, 9, 10 for the prefixes
    assert fit_words(chars, words, 7) == "aa b cccc"
    assert fit_words(chars, words, 8) == "aa b cccc"       # 7 is as close as 9; the shorter wins
    assert fit_words(chars, words, 4) == "aa b"            # 3 is closer than 7
    assert fit_words(chars, words, 6) == "aa b cccc"       # 7 is closer than 3
    assert fit_words(chars, words, 1) == "aa"
    with pytest.raises(ValueError):
        fit_words(chars, words, 11)
    with pytest.raises(ValueError):
        fit_words(chars, [], 1)


def test_token_rows_are_seeded_and_shaped() -> None:
    prefix, branches = token_rows(1000, 200, 30, 8, seed=1)
    assert (prefix, branches) == token_rows(1000, 200, 30, 8, seed=1)
    assert token_rows(1000, 200, 30, 8, seed=2)[0] != prefix
    assert len(prefix) == 200 and len(branches) == 8 and all(len(b) == 30 for b in branches)
    assert all(8 <= t < 1000 for row in [prefix, *branches] for t in row)


def test_inputs_count_tokens_as_causal_rows_and_as_state_once() -> None:
    inputs = Inputs("s", state_tokens=200, prefix_tokens=270, question_tokens=[60, 70, 50], vocab=1000)
    assert inputs.causal_tokens(3) == 330 + 340 + 320
    assert inputs.state_once_tokens(3) == 270 + 180
    assert inputs.causal_tokens(1) == inputs.state_once_tokens(1) == 330
    body = inputs.body("m", 2)
    assert body["model"] == "m" and body["state"] == "s" and len(body["questions"]) == 2


def test_the_decision_benchmarks_keep_torch_and_onnxruntime_out_of_the_harness() -> None:
    code = ("import sys, bench.__main__, bench.decisions, bench.decision_codes, bench.vela2, bench.decision_vision; "
            "sys.exit(1 if 'torch' in sys.modules or 'onnxruntime' in sys.modules else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_every_long_input_shape_has_its_size_and_its_shape() -> None:
    from bench.harness.texts import SHAPES, shaped_text

    n = 300_000
    texts = {shape: shaped_text(shape, n) for shape in SHAPES}
    for shape, text in texts.items():
        assert n - 3 <= len(text.encode("utf-8")) <= n, shape
        assert shaped_text(shape, n) == text, shape  # deterministic
    assert texts["one long word"].isalpha() and texts["one long word"].isascii()
    assert set(texts["punctuation runs"]) == {"!", "?"}
    assert set(texts["hex"]) <= set("0123456789abcdef")
    assert not any(ch.isspace() for ch in texts["CJK without spaces"] + texts["base64"])
    assert sum(ch.isspace() for ch in texts["whitespace runs"]) > 0.9 * len(texts["whitespace runs"])
    assert texts["whitespace runs"].strip() == texts["whitespace runs"]  # a server's strip() keeps it
    assert "\ufffd" in texts["surrogates replaced"] and "\U0001F600" in texts["emoji"]
    assert len({ord(ch) >> 8 for ch in texts["mixed scripts"]}) >= 8  # many Unicode blocks


def test_vela2_requests_are_the_contract_examples_and_a_long_state_of_the_target_tokens() -> None:
    from bench.vela2 import EXAMPLE_1, EXAMPLE_2, LONG, LONG_TOKENS, bench_requests
    from edge_runtime.api.schema import request_validator
    from edge_runtime.examples import DECISIONS_EXAMPLE_1, DECISIONS_EXAMPLE_2

    words = lambda text: len(text.split())  # noqa: E731 - a stand-in tokenizer: one token a word
    requests = bench_requests(words, model="m")
    assert requests == bench_requests(words, model="m")  # deterministic
    assert requests[EXAMPLE_1] == {**DECISIONS_EXAMPLE_1, "model": "m"}
    assert requests[EXAMPLE_2] == {**DECISIONS_EXAMPLE_2, "model": "m"}
    long = requests[LONG]
    assert words(long["state"]) == LONG_TOKENS
    assert {q["type"] for q in long["questions"].values()} == {"noul", "span"}
    validator = request_validator("/v1/decisions")
    for request in requests.values():
        validator.validate(request)


def test_vela2_decisions_of_reads_choices_selections_and_spans() -> None:
    from bench.vela2 import decisions_of

    body = {"answers": {"d": {"type": "choice", "choice": "code", "probabilities": {"code": 0.9, "math": 0.1}},
                        "r": {"type": "noul", "noul": 0.4}},
            "sets": {"p": {"selected": ["billing"], "probabilities": {"billing": 0.8}}},
            "spans": {"c": [{"label": "EMAIL", "start": 3, "end": 9, "text": "a@b.co", "probability": 0.7}]}}
    assert decisions_of(body) == {"d": "code", "sets.p": ["billing"], "spans.c": [("EMAIL", 3, 9)]}
    assert decisions_of({"answers": {"r": {"type": "noul", "noul": 0.4}}}) == {}


def test_decision_vision_requests_carry_an_image_and_a_video_and_validate() -> None:
    from bench.decision_vision import IMAGE, VIDEO, bench_requests
    from edge_runtime.api.schema import request_validator

    requests = bench_requests(model="m")
    assert requests == bench_requests(model="m")  # deterministic
    image, video = requests[IMAGE], requests[VIDEO]
    assert image["images"][0].startswith("data:image/png;base64,") and "videos" not in image
    assert video["videos"][0].startswith("data:video/mp4;base64,") and "images" not in video
    for request in requests.values():
        assert len(request["questions"]) == 4
        assert {q["type"] for q in request["questions"].values()} == {"choice", "noul", "score"}
        request_validator("/v1/decisions").validate(request)


class _Echo(http.server.BaseHTTPRequestHandler):
    """Echoes the JSON body it is sent, as HTTP/1.1 (kept alive) or HTTP/1.0 (closed, no length)."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.protocol_version == "HTTP/1.1":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("protocol", ["HTTP/1.1", "HTTP/1.0"])
def test_lean_client_frames_responses_kept_alive_or_closed(protocol: str) -> None:
    handler = type("Handler", (_Echo,), {"protocol_version": protocol})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = LeanClient(server.server_address[1])
    try:
        for i in range(3):
            body = json.dumps({"i": i, "pad": "x" * 70_000}).encode()  # more than one recv
            assert client.post("/v1/decisions", body) == (200, body)
            assert (client.sock is None) == (protocol == "HTTP/1.0")
    finally:
        client.close()
        server.shutdown()
        server.server_close()


def test_thread_plan_argument_reads_a_servers_plan_and_refuses_garbage() -> None:
    import argparse

    from bench.contestant import _thread_plan

    assert _thread_plan("512:2,64:1") == ((64, 1), (512, 2))
    for bad in ("64", "64:x", "", "64:1;512:2"):
        with pytest.raises(argparse.ArgumentTypeError):
            _thread_plan(bad)


def test_issue_40_goals_judge_each_client_against_torch_and_the_in_process_graph() -> None:
    from bench import embeddings
    from bench.harness.stats import Summary

    def result(key: str, b1_ms: float, b32_ms: float) -> embeddings.Result:
        by = {size: Summary(ms / 1000, ms / 1000, ms / 1000, ms / 1000, 1)
              for size, ms in ((1, b1_ms), (8, b1_ms * 8), (embeddings.BATCH, b32_ms))}
        return embeddings.Result(key, type("C", (), {"label": key})(), by)  # type: ignore[arg-type]

    results = {embeddings.REFERENCE: result("torch", 7.5, 90.0),
               "ours-int8-b64": result("http.client", 3.1, 45.0),  # 2.42x, 2.0x, +1.1 ms
               embeddings.LEAN: result("lean", 2.9, 36.0),  # 2.59x, 2.5x, +0.9 ms
               embeddings.ORT_INT8: result("in-process", 2.0, 34.0)}
    rows = embeddings.goals_table(results, {"forward": 2.0, "total": 2.4}).rows
    assert [r[-1] for r in rows] == ["NOT met", "NOT met", "NOT met", "met", "met", "NOT met", "met"]
    assert rows[6][1] == "0.40 ms"
    assert rows[2][1] == "1.10 ms" and rows[5][1] == "0.90 ms"
