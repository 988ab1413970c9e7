"""`tailguard conformance`: its checks and comparison (tailguard/conformance/), on canned answers;
its command line and the deprecated `tailguard bench --workload compat` spelling."""

import json

import pytest

from tailguard.conformance.catalog import CHECKS, by_name
from tailguard.conformance.check import (
    MODEL,
    REFUSAL_REASONS,
    SPECIAL_TEXT,
    TOKEN,
    Answer,
    Call,
    Check,
    Context,
    Failed,
    Result,
    documented_refusal,
    fill,
    fill_text,
    judge,
    need,
    skipped,
)
from tailguard.conformance.compare import SideRun, compare, render_text, row
from tailguard.conformance.run import capabilities_of
from tailguard.conformance.sender import _events
from tailguard.gateway.openai_request import BATCH_REFUSED, REFUSED_FIELDS

VLLM = Context(side="vllm", model="m", max_model_len=4096, token=42, token_text=" yes",
               special=2, special_text="<|im_end|>")
TG = Context(**{**VLLM.__dict__, "side": "tailguard"})


def completion(text="abc", tokens=3, reason="length", **extra):
    return Answer(200, body={"object": "text_completion", "model": "m", "id": "cmpl-1",
                             "choices": [{"index": 0, "text": text, "finish_reason": reason}],
                             "usage": {"prompt_tokens": 5, "completion_tokens": tokens}, **extra})


def chat(content="hi", tokens=3, reason="stop", prompt_tokens=20, **extra):
    return Answer(200, body={"object": "chat.completion", "model": "m", "id": "chatcmpl-1",
                             "choices": [{"index": 0, "finish_reason": reason,
                                          "message": {"role": "assistant", "content": content}}],
                             "usage": {"prompt_tokens": prompt_tokens,
                                       "completion_tokens": tokens}, **extra})


def error(status, message="no", param=None, job=None):
    return Answer(status, headers={"x-tailguard-job-id": job} if job else {},
                  body={"error": {"message": message, "type": "BadRequestError", "param": param,
                                  "code": status}})


def stream_of(chunks, done=True):
    payloads = [json.dumps(c) for c in chunks] + (["[DONE]"] if done else [])
    lines = [line for p in payloads for line in (f"data: {p}", "")]
    return Answer(200, events=_events(lines), lines=lines)


def get(name):
    return next(c for c in CHECKS if c.name == name)


def test_the_checks_are_many_named_once_and_cover_the_issue():
    names = [c.name for c in CHECKS]
    assert 60 <= len(names) <= 100 and len(set(names)) == len(names)
    for name in ("chat_max_tokens_omitted", "completion_max_tokens_omitted",
                 "stream_continuous_usage", "developer_role", "content_parts", "tools_choice_none",
                 "unknown_store", "nan_temperature", "seed_2_70", "min_tokens_over_max_tokens",
                 "prompt_batch", "guided_json", "models", "request_id", "tokenize", "detokenize",
                 "request_id_header", "request_id_body", "request_id_stream", "vllm_metrics",
                 "responses", "responses_stream", "responses_previous_id"):
        assert name in names
    assert {c.name for c in CHECKS if c.required} == {
        "nan_temperature", "seed_2_70", "min_tokens_over_max_tokens"}
    for c in CHECKS:
        assert c.calls and c.what
        if c.refused:
            assert c.refused in REFUSAL_REASONS
    # every documented refusal reason the checks ask about is tailguard's own text
    assert REFUSAL_REASONS["prompt"] == BATCH_REFUSED
    assert REFUSAL_REASONS["guided_json"] == REFUSED_FIELDS["guided_json"]


def test_by_name_keeps_the_order_and_refuses_unknown_names():
    assert by_name(None) == CHECKS
    assert [c.name for c in by_name(["seed", "models"])] == ["models", "seed"]
    with pytest.raises(ValueError, match="nope"):
        by_name(["models", "nope"])


def test_placeholders_are_filled_in_values_and_keys():
    body = {"model": MODEL, "logit_bias": {TOKEN: 100}, "prompt": [TOKEN, 7],
            "stop": [SPECIAL_TEXT, "x"], "n": 1}
    assert fill(body, VLLM) == {"model": "m", "logit_bias": {"42": 100}, "prompt": [42, 7],
                                "stop": ["<|im_end|>", "x"], "n": 1}
    assert fill_text('{"model": "$MODEL", "temperature": NaN}', VLLM) == \
        '{"model": "m", "temperature": NaN}'


def test_judge_passes_fails_and_says_what_it_saw():
    c = get("completion")
    assert judge(c, [completion(tokens=8)], VLLM) == Result("pass", "200, 8 tokens, length")
    r = judge(c, [completion(tokens=9)], VLLM)
    assert r.status == "fail" and "9 tokens > max_tokens 8" in r.detail
    r = judge(c, [error(400, "bad thing")], VLLM)
    assert r.status == "fail" and "400" in r.detail and "bad thing" in r.detail
    # a predicate tripping over an odd shape is a failure with the answer shown, not a crash
    r = judge(c, [Answer(200, body={"object": "text_completion"})], VLLM)
    assert r.status == "fail" and "unexpected answer" in r.detail


def test_a_tool_call_needs_an_object_of_arguments():
    def called(arguments: str) -> Answer:
        return Answer(200, body={
            "object": "chat.completion", "model": "m", "id": "chatcmpl-1",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": "", "tool_calls": [{
                    "id": "c1", "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments}}]}}]})

    ctx = Context(**{**VLLM.__dict__, "capabilities": capabilities_of(
        ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"])})
    named = get("tools_choice_named")
    assert judge(named, [called('{"unit": "c"}')], ctx).status == "pass"
    # a JSON string where the object goes (seen from tailguard's worker): a plain failure
    r = judge(named, [called('"dogs"')], ctx)
    assert (r.status, r.detail) == ("fail", """arguments '"dogs"'""")


def test_a_documented_refusal_counts_only_on_tailguard_and_only_as_documented():
    c = get("guided_json")
    documented = error(400, f"guided_json is refused here: {REFUSED_FIELDS['guided_json']}",
                       param="guided_json")
    assert judge(c, [documented], TG).status == "refused"
    assert judge(c, [documented], VLLM).status == "fail"  # vLLM serves it
    assert judge(c, [chat()], VLLM).status == "pass"
    other = judge(c, [error(400, "something else", param="guided_json")], TG)
    assert other.status == "fail" and "not the documented refusal" in other.detail
    assert documented_refusal(error(500, REFUSED_FIELDS["guided_json"]), "guided_json") == \
        "status 500, not 400"
    batch = error(400, f"{BATCH_REFUSED} (got 2 prompts)", param="prompt")
    assert judge(get("prompt_batch"), [batch], TG).status == "refused"


def test_the_omitted_max_tokens_check_accepts_a_reason_for_length():
    c = get("chat_max_tokens_omitted")
    assert judge(c, [chat(reason="stop", tokens=12)], VLLM).status == "pass"
    # vLLM: the rest of the context
    assert judge(c, [chat(reason="length", tokens=4076, prompt_tokens=20)], VLLM).status == "pass"
    # tailguard: the lane's cap, said in its documented extra field
    capped = chat(reason="length", tokens=256, tailguard={
        "lane": "short", "max_tokens": 256, "max_tokens_capped": True, "finish_reason": "length"})
    assert judge(c, [capped], TG).status == "pass"
    silent = judge(c, [chat(reason="length", tokens=64)], TG)
    assert silent.status == "fail" and "no reason" in silent.detail


def test_stream_framing():
    c = get("stream_include_usage")
    chunks = [{"id": "c", "object": "text_completion", "usage": None,
               "choices": [{"index": 0, "text": "a", "finish_reason": None}]},
              {"id": "c", "object": "text_completion", "usage": None,
               "choices": [{"index": 0, "text": "b", "finish_reason": "length"}]},
              {"id": "c", "object": "text_completion", "choices": [],
               "usage": {"prompt_tokens": 3, "completion_tokens": 5}}]
    assert judge(c, [stream_of(chunks)], VLLM).status == "pass"
    no_done = judge(c, [stream_of(chunks, done=False)], VLLM)
    assert no_done.status == "fail" and "[DONE]" in no_done.detail
    two_ids = [chunks[0], {**chunks[1], "id": "other"}, chunks[2]]
    assert "different ids" in judge(c, [stream_of(two_ids)], VLLM).detail
    errored = [chunks[0], {"id": "c", "object": "text_completion", "error": {"message": "x"}}]
    assert "error event" in judge(c, [stream_of(errored)], VLLM).detail


def test_the_id_checks_want_vllms_ids():
    header = get("request_id_header")
    assert header.calls[0].headers == {"X-Request-Id": "compat-rid-31"}
    assert judge(header, [completion(id="cmpl-compat-rid-31")], TG).status == "pass"
    # the body's request_id (also sent) must lose to the header, a job id is no id of vLLM's
    for wrong in ("cmpl-compat-body-31", "cmpl-0123abcd"):
        assert judge(header, [completion(id=wrong)], TG).status == "fail"
    body = get("request_id_body")
    assert judge(body, [chat(id="chatcmpl-compat-body-32")], VLLM).status == "pass"
    assert judge(body, [chat(id="chatcmpl-1")], VLLM).status == "fail"
    chunk = {"id": "chatcmpl-compat-rid-33", "object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "length"}]}
    assert judge(get("request_id_stream"), [stream_of([chunk])], VLLM).status == "pass"
    other = {**chunk, "id": "chatcmpl-job"}
    assert judge(get("request_id_stream"), [stream_of([other])], VLLM).status == "fail"


def _exposition(labels: str) -> str:
    from tailguard.conformance.catalog import VLLM_METRIC_SAMPLES

    return "\n".join(f"{name}{{{labels}}} 1.0" for name in VLLM_METRIC_SAMPLES)


def test_the_metrics_check_wants_vllms_series_and_on_tailguard_whose_they_are():
    c = get("vllm_metrics")
    assert c.calls[0].route == "metrics"
    vllms = 'engine="0",model_name="m"'
    assert judge(c, [Answer(200, body=_exposition(vllms))], VLLM).status == "pass"
    # tailguard's: each worker's engine, labelled with the worker, its lanes in an info series
    assert judge(c, [Answer(200, body=_exposition(vllms))], TG).status == "fail"
    workers = "\n".join((_exposition(vllms + ',worker="short@h"'),
                         _exposition(vllms + ',worker="long@h"')))
    assert judge(c, [Answer(200, body=workers)], TG).status == "fail"  # whose lanes?
    info = "\n".join(f'tailguard_worker_lanes_info{{lane="{lane}",worker="{w}"}} 1.0'
                     for lane, w in (("short", "short@h"), ("long", "long@h"), ("batch", "long@h")))
    r = judge(c, [Answer(200, body=workers + "\n" + info)], TG)
    assert r.status == "pass" and "2 engine(s), lanes batch, long, short" in r.detail
    missing = judge(c, [Answer(200, body="vllm:num_requests_running{} 0")], VLLM)
    assert missing.status == "fail" and "vllm:kv_cache_usage_perc" in missing.detail
    assert judge(c, [Answer(None, error="refused")], VLLM).status == "fail"


def _response(text="Hi", status="completed", **extra):
    return {"id": "resp_1", "object": "response", "status": status,
            "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
            "usage": {"input_tokens": 9, "output_tokens": 2}, **extra}


def test_the_responses_checks():
    assert judge(get("responses"), [Answer(200, body=_response())], VLLM).status == "pass"
    empty = judge(get("responses"), [Answer(200, body=_response(text=""))], VLLM)
    assert empty.status == "fail" and "no output text" in empty.detail
    assert judge(get("responses_request_id"), [Answer(200, body=_response(id="resp_compat-34"))],
                 TG).status == "pass"
    events = [{"type": "response.created", "response": _response(text="")},
              {"type": "response.output_text.delta", "delta": "H"},
              {"type": "response.output_text.delta", "delta": "i"},
              {"type": "response.completed", "response": _response()}]
    lines = [line for e in events for line in (f"event: {e['type']}", f"data: {json.dumps(e)}", "")]
    streamed = Answer(200, events=events, lines=lines)
    assert judge(get("responses_stream"), [streamed], VLLM).status == "pass"
    unnamed = Answer(200, events=events, lines=[ln for ln in lines if ln.startswith("data")])
    assert "event names" in judge(get("responses_stream"), [unnamed], VLLM).detail
    # previous_response_id: vLLM has nothing stored (404); tailguard refuses it as documented
    c = get("responses_previous_id")
    assert judge(c, [error(404, "Response with id 'x' not found.")], VLLM).status == "pass"
    documented = error(400, "previous_response_id is refused here: "
                       + REFUSAL_REASONS["previous_response_id"], param="previous_response_id")
    assert judge(c, [documented], TG).status == "refused"


def test_two_call_checks_compare_their_answers():
    c = get("developer_role")
    assert judge(c, [chat(prompt_tokens=30), chat(prompt_tokens=30)], VLLM).status == "pass"
    r = judge(c, [chat(prompt_tokens=25), chat(prompt_tokens=30)], VLLM)
    assert r.status == "fail" and "25 prompt tokens as developer, 30 as system" in r.detail


def test_a_skipped_check_says_why():
    c = get("tools_choice_auto")
    assert skipped(c, VLLM).status == "skip"
    assert "tool parser" in skipped(c, VLLM).detail
    assert skipped(c, Context(side="vllm", capabilities=frozenset({"tool_parser"}))) is None
    assert capabilities_of(["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]) == \
        frozenset({"tool_parser"})
    assert capabilities_of(["--tool-call-parser=hermes"]) == frozenset()


def _check(name="c", refused=None, required=False):
    return Check(name, "area", "what", (Call("models"),), lambda answers, ctx: "ok",
                 refused=refused, required=required)


P, F, S, R = (Result(s, s) for s in ("pass", "fail", "skip", "refused"))


@pytest.mark.parametrize(("check", "vllm", "tailguard", "verdict"), [
    (_check(), P, P, "same"),
    (_check(), P, F, "violation"),
    (_check(), F, P, "better"),
    (_check(), F, F, "neither"),
    (_check(), S, S, "skip"),
    (_check(refused="guided_json"), P, R, "refused"),
    (_check(refused="guided_json"), P, F, "violation"),  # refused, but not as documented
    (_check(required=True), F, P, "better"),
    (_check(required=True), P, F, "violation"),
    (_check(required=True), F, F, "violation"),  # whatever vLLM does
])
def test_row_verdicts(check, vllm, tailguard, verdict):
    assert row(check, vllm, tailguard).verdict == verdict


def _runs(checks, vllm, tailguard):
    v, t = SideRun("vllm"), SideRun("tailguard")
    for c, rv, rt in zip(checks, vllm, tailguard, strict=True):
        v.results[c.name], t.results[c.name] = rv, rt
        v.answers[c.name], t.answers[c.name] = [completion()], [completion()]
    return v, t


def test_compare_passes_when_tailguard_keeps_what_vllm_passes():
    checks = [_check("a"), _check("b", refused="guided_json"), _check("c"), _check("d")]
    v, t = _runs(checks, [P, P, F, S], [P, R, F, S])
    t.jobs = {"j1": "succeeded", "j2": "succeeded"}
    report = compare(checks, v, t)
    assert [x["status"] for x in report["targets"]] == ["PASS", "PASS", "PASS"]
    parity = report["targets"][0]["line"]
    assert "vLLM passes 2, tailguard 1 of them; 1 documented refusals (b)" in parity
    assert report["counts"]["vllm"] == {"pass": 2, "fail": 1, "skip": 1, "refused": 0}
    assert report["counts"]["tailguard"] == {"pass": 1, "fail": 1, "skip": 1, "refused": 1}
    assert report["counts"]["verdicts"]["refused"] == 1 and not report["violations"]


def test_compare_fails_each_target_on_its_own_evidence():
    checks = [_check("a"), _check("b")]
    v, t = _runs(checks, [P, P], [F, P])
    t.jobs = {"j1": "failed", "j2": "succeeded"}
    t.answers["b"] = [Answer(500, body={"error": {"message": "boom"}}, requests=3, retries=2,
                             would_retry=3)]
    t.finished_by_status = {"failed": 1.0, "succeeded": 1.0}
    report = compare(checks, v, t)
    assert [x["status"] for x in report["targets"]] == ["FAIL", "FAIL", "FAIL"]
    assert "1 violations: a" in report["targets"][0]["line"]
    assert "1 of 2 tailguard jobs ended failed (j1)" in report["targets"][1]["line"]
    assert "/metrics: 1 failed" in report["targets"][1]["line"]
    assert "2 retries in 3 SDK requests" in report["targets"][2]["line"]
    assert "1 answers a default-retrying SDK would retry" in report["targets"][2]["line"]


def test_an_error_that_names_a_job_was_refused_after_queueing():
    checks = [_check("a")]
    v, t = _runs(checks, [P], [P])
    t.answers["a"] = [error(400, "engine refused", job="j9")]
    line = compare(checks, v, t)["targets"][1]
    assert line["status"] == "FAIL" and "1 error answers named a job (a)" in line["line"]


def test_render_text_has_the_table_the_counts_and_the_lines():
    checks = [_check("alpha"), _check("beta", refused="guided_json")]
    v, t = _runs(checks, [P, P], [P, R])
    text = render_text({"compat": compare(checks, v, t), "targets": compare(checks, v, t)["targets"]})
    lines = text.splitlines()
    assert lines[0].split() == ["check", "vllm", "tailguard", "verdict"]
    assert any(line.split() == ["alpha", "pass", "pass", "same"] for line in lines)
    assert any(line.split() == ["beta", "pass", "refused", "refused"] for line in lines)
    assert "2 checks; vllm: 2 pass; tailguard: 1 pass, 1 refused" in text
    assert sum(line.startswith("PASS  ") for line in lines) == 3


def test_need():
    need(True, "unused")
    with pytest.raises(Failed, match="why"):
        need(0, "why")


def test_the_command_and_its_deprecated_spelling_parse(monkeypatch):
    """`tailguard conformance` takes the options the run needs; `tailguard bench --workload
    compat` runs the same code with a one-line deprecation note."""
    from click.testing import CliRunner

    from tailguard import cli

    seen = []
    monkeypatch.setattr(cli, "_conformance", lambda cfg, check: seen.append((cfg, check)))
    runner = CliRunner()
    assert runner.invoke(cli.main, ["conformance", "--help"]).exit_code == 0
    result = runner.invoke(cli.main, ["conformance", "--checks", "models,chat", "--cores", "0,1",
                                      "--out", "x", "--no-progress", "--check"])
    assert result.exit_code == 0, result.output
    cfg, check = seen.pop()
    assert (cfg.checks, cfg.cores, str(cfg.out_dir), cfg.progress, check) == (
        ("models", "chat"), (0, 1), "x", False, True)
    result = runner.invoke(cli.main, ["bench", "--workload", "compat", "--compat-checks", "models",
                                      "--cores", "0", "--out", "y"])
    assert result.exit_code == 0, result.output
    cfg, check = seen.pop()
    assert (cfg.checks, cfg.cores, str(cfg.out_dir), check) == (("models",), (0,), "y", False)
    assert "deprecated" in result.output and "tailguard conformance" in result.output
