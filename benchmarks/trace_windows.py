"""What a trace workload would offer a host, before running it: pick --rate and --token-scale.

For each Azure trace workload and window start, the window `tailguard bench` would replay
(tailguard/bench/azure_trace.py: the same selection, scaling and lane rule), and what it
offers per lane: requests/s, prompt tokens/s (prefill) and output tokens/s (decode), to set
against what the host's engines do (docs/benchmarks.md). No engine, no tokenizer: lengths
come from the trace, so it runs in a second.

    .venv/bin/python benchmarks/trace_windows.py --rate 3 --token-scale 0.25 --duration 300 \
        --starts 0,600,1200,1800,2400 [--lanes FILE] [--model-max-len 8192]
"""

from __future__ import annotations

import argparse

from tailguard.bench.azure_trace import (
    TRACES,
    load_trace,
    longest_context,
    scaled_lengths,
    select_window,
)
from tailguard.lanes.placement import place
from tailguard.lanes.table import default_lanes_path, load_lanes


def offered(name: str, *, lanes: list, model_max_len: int | None, rate: float, duration_s: float,
            token_scale: float, start_s: float) -> dict:
    """The window's rate and time scale, and per lane: requests, prompt and output tokens/s."""
    win = select_window(load_trace(name), start_s=start_s, duration_s=duration_s, rate=rate)
    context = longest_context(lanes, model_max_len)
    per: dict[str, dict[str, float]] = {}
    for row in win.rows:
        prompt, out, _ = scaled_lengths(row, token_scale, context)
        where = place(lanes, priority="interactive", prompt_tokens=prompt,
                      requested_max_tokens=out, model_max_len=model_max_len)
        lane = per.setdefault(where.lane, {"requests": 0, "prompt": 0, "output": 0})
        lane["requests"] += 1
        lane["prompt"] += prompt
        lane["output"] += where.max_tokens
    return {"trace_rate": len(win.rows) / win.span_s, "time_scale": win.time_scale,
            "lanes": {k: {"rps": v["requests"] / duration_s, "prompt_tok_s": v["prompt"] / duration_s,
                          "output_tok_s": v["output"] / duration_s}
                      for k, v in per.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=2.5)
    ap.add_argument("--duration", type=float, default=90.0)
    ap.add_argument("--token-scale", type=float, default=0.25)
    ap.add_argument("--starts", default="0,600,1200,1800,2400", help="window starts, trace seconds")
    ap.add_argument("--lanes", default=str(default_lanes_path()))
    ap.add_argument("--model-max-len", type=int, default=None)
    args = ap.parse_args()
    lanes = list(load_lanes(args.lanes))
    print(f"rate {args.rate:g} req/s for {args.duration:g} s, token scale {args.token_scale:g}, "
          f"lanes {args.lanes}")
    print("| trace | start s | traced req/s | time scale | lane | req/s | prompt tok/s | output tok/s |")
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for name in TRACES:
        for start in (float(s) for s in args.starts.split(",")):
            try:
                o = offered(name, lanes=lanes, model_max_len=args.model_max_len, rate=args.rate,
                            duration_s=args.duration, token_scale=args.token_scale, start_s=start)
            except ValueError as exc:
                print(f"| {name} | {start:g} | {exc} |")
                continue
            for lane, v in o["lanes"].items():
                print(f"| {name} | {start:g} | {o['trace_rate']:.2f} | {o['time_scale']:.2f} | "
                      f"{lane} | {v['rps']:.2f} | {v['prompt_tok_s']:.0f} | {v['output_tok_s']:.0f} |")


if __name__ == "__main__":
    main()
