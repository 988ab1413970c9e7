"""The two sides compared: a row per check, the counts, the three targets and the text report.

Pure. The targets (issue 24):

* tailguard passes every check vLLM passes, except a **documented refusal** (answered with
  the documented 400); a check marked ``required`` (a body no engine can run: NaN, a seed
  past 64 bits, min_tokens above max_tokens) must pass on tailguard whatever vLLM does;
* no request refused after queueing: no job of the run ended ``failed``;
* the SDK made 0 retries, and no answer was one a default-retrying SDK would retry
  (408, 409, 429, 5xx), which would have queued the same request twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tailguard.conformance.check import Answer, Check, Result

SIDES = ("vllm", "tailguard")
#: where the refusals are written down, for the report
REFUSALS_DOC = ("docs/api.md#openai-compatible-routes (\"Refused on purpose\"); "
                "tailguard/gateway/openai_request.py: REFUSED_FIELDS, BATCH_REFUSED")


@dataclass(frozen=True)
class Row:
    check: str
    area: str
    what: str
    vllm: Result
    tailguard: Result
    verdict: Literal["same", "refused", "violation", "better", "skip", "neither"]
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "area": self.area, "what": self.what,
                "vllm": self.vllm.to_dict(), "tailguard": self.tailguard.to_dict(),
                "verdict": self.verdict, "note": self.note}


def row(check: Check, vllm: Result, tailguard: Result) -> Row:
    """How the two sides' results of `check` compare:

    * ``violation``: tailguard fails a check vLLM passes (not a documented refusal), or a
      ``required`` one whatever vLLM did, or a documented refusal not as documented;
    * ``refused``: a documented refusal, answered as documented;
    * ``same``: both pass; ``better``: tailguard passes what vLLM fails;
    * ``neither``: both fail (not required); ``skip``: skipped on a side.
    """
    v, t = vllm.status, tailguard.status
    if check.required and t != "pass":
        return Row(check.name, check.area, check.what, vllm, tailguard, "violation",
                   "required on tailguard")
    if "skip" in (v, t):
        return Row(check.name, check.area, check.what, vllm, tailguard, "skip")
    if t == "refused":
        return Row(check.name, check.area, check.what, vllm, tailguard, "refused",
                   f"documented refusal of {check.refused}")
    if v == "pass":
        verdict = "same" if t == "pass" else "violation"
        note = "" if t == "pass" else (
            f"documented refusal of {check.refused}, but not as documented" if check.refused
            else "vLLM passes, tailguard does not")
        return Row(check.name, check.area, check.what, vllm, tailguard, verdict, note)
    return Row(check.name, check.area, check.what, vllm, tailguard,
               "better" if t == "pass" else "neither")


@dataclass
class SideRun:
    """One side's run: each check's answers and result, and what tailguard's job records say."""

    side: str
    answers: dict[str, list[Answer]] = field(default_factory=dict)
    results: dict[str, Result] = field(default_factory=dict)
    #: tailguard: every job id an answer named, with its final status
    jobs: dict[str, str] = field(default_factory=dict)
    #: tailguard: /metrics' finished-request counters, by status, over the run
    finished_by_status: dict[str, float] = field(default_factory=dict)

    def answer_list(self) -> list[Answer]:
        return [a for answers in self.answers.values() for a in answers]

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in ("pass", "fail", "skip", "refused")}
        for r in self.results.values():
            out[r.status] += 1
        return out

    def sdk_requests(self) -> int:
        return sum(a.requests for a in self.answer_list())

    def retries(self) -> int:
        return sum(a.retries for a in self.answer_list())

    def would_retry(self) -> list[str]:
        """Each check with an answer a default-retrying SDK would have retried."""
        return [f"{name} ({'; '.join(a.brief() for a in answers if a.would_retry)})"
                for name, answers in self.answers.items() if any(a.would_retry for a in answers)]

    def failed_jobs(self) -> list[str]:
        """Jobs that ended ``failed``: requests refused (or lost) after they were queued."""
        return sorted(job for job, status in self.jobs.items() if status == "failed")

    def errors_with_a_job(self) -> list[str]:
        """Checks answered with an error that named a job: refused after it existed."""
        return [name for name, answers in self.answers.items()
                if any(a.status is not None and a.status >= 400 and a.job_id for a in answers)]


def compare(checks: Sequence[Check], vllm: SideRun, tailguard: SideRun) -> dict[str, Any]:
    """The report's body: a row per check, the counts per side, and the three targets."""
    rows = [row(c, vllm.results[c.name], tailguard.results[c.name]) for c in checks]
    violations = [r for r in rows if r.verdict == "violation"]
    refused = [r for r in rows if r.verdict == "refused"]
    vllm_pass = [r for r in rows if r.vllm.status == "pass"]
    kept = [r for r in vllm_pass if r.tailguard.status == "pass"]
    failed_jobs, with_job = tailguard.failed_jobs(), tailguard.errors_with_a_job()
    failed_metric = tailguard.finished_by_status.get("failed", 0)
    retries, would = tailguard.retries(), tailguard.would_retry()
    targets: list[dict[str, Any]] = []

    def line(name: str, ok: bool, text: str) -> None:
        status = "PASS" if ok else "FAIL"
        targets.append({"name": name, "status": status, "line": f"{status}  {text}"})

    line("parity", not violations,
         f"tailguard passes every check vLLM passes, except documented refusals: vLLM passes "
         f"{len(vllm_pass)}, tailguard {len(kept)} of them; {len(refused)} documented refusals "
         f"({', '.join(r.check for r in refused) or 'none'}); "
         + (f"{len(violations)} violations: {', '.join(r.check for r in violations)}"
            if violations else "no violation"))
    line("no_failed_jobs", not failed_jobs and not with_job and not failed_metric,
         f"no request refused after queueing: {len(failed_jobs)} of {len(tailguard.jobs)} "
         f"tailguard jobs ended failed"
         + (f" ({', '.join(failed_jobs)})" if failed_jobs else "")
         + f"; {len(with_job)} error answers named a job"
         + (f" ({', '.join(with_job)})" if with_job else "")
         + f"; /metrics: {failed_metric:g} failed")
    line("no_retries", retries == 0 and not would,
         f"the SDK made 0 retries: {retries} retries in {tailguard.sdk_requests()} SDK requests "
         f"to tailguard (max_retries=0); {len(would)} answers a default-retrying SDK would "
         f"retry (408/409/429/5xx)" + (f": {', '.join(would)}" if would else ""))
    return {
        "rows": [r.to_dict() for r in rows],
        "counts": {"checks": len(rows), "vllm": vllm.counts(), "tailguard": tailguard.counts(),
                   "verdicts": {v: sum(1 for r in rows if r.verdict == v) for v in
                                ("same", "refused", "violation", "better", "neither", "skip")}},
        "violations": [r.to_dict() for r in violations],
        "vllm_would_retry": vllm.would_retry(),
        "refusals_doc": REFUSALS_DOC,
        "targets": targets,
    }


def render_text(report: dict[str, Any]) -> str:
    """The table (check, vllm, tailguard), the counts and the PASS/FAIL lines."""
    rows = report["compat"]["rows"]
    width = max(len(r["check"]) for r in rows) + 2
    mark = {"pass": "pass", "fail": "FAIL", "skip": "skip", "refused": "refused"}
    out = [f"{'check':{width}}{'vllm':9}{'tailguard':11}verdict", "-" * (width + 36)]
    for r in rows:
        out.append(f"{r['check']:{width}}{mark[r['vllm']['status']]:9}"
                   f"{mark[r['tailguard']['status']]:11}{r['verdict']}"
                   + (f"  ({r['note']})" if r["note"] and r["verdict"] != "refused" else ""))
    details = [r for r in rows if r["verdict"] in ("violation", "neither", "better")
               or "fail" in (r["vllm"]["status"], r["tailguard"]["status"])]
    if details:
        out += ["", "where a side fails:"]
        for r in details:
            out.append(f"  {r['check']} [{r['verdict']}]: {r['what']}")
            for side in SIDES:
                out.append(f"    {side:9} {r[side]['status']}: {r[side]['detail']}")
    c = report["compat"]["counts"]
    out += ["", f"{c['checks']} checks; " + "; ".join(
        f"{side}: " + ", ".join(f"{n} {s}" for s, n in c[side].items() if n) for side in SIDES)
        + "; verdicts: " + ", ".join(f"{n} {v}" for v, n in c["verdicts"].items() if n),
        f"documented refusals: {report['compat']['refusals_doc']}"]
    if report["compat"]["vllm_would_retry"]:
        out.append("vLLM answered what a default SDK would retry: "
                   + ", ".join(report["compat"]["vllm_would_retry"]))
    out += ["", *(t["line"] for t in report["targets"])]
    return "\n".join(out) + "\n"
