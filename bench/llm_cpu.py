"""Throughput and priority latency of the CPU vLLM server through the bot's OpenAI backend.

Usage: python bench/llm_cpu.py [--throughput-url URL] [--queue-url URL] [--max-tokens N]
Without URLs it starts the servers itself with scripts/vllm_cpu.sh (default --max-num-seqs for
throughput, --max-num-seqs 2 for the queueing test) and stops them afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bot.llm.base import LLMRequest  # noqa: E402
from bot.llm.openai_compat import OpenAICompatBackend  # noqa: E402
from bot.review.prompts import build_messages  # noqa: E402

SCRIPT = REPO / "scripts" / "vllm_cpu.sh"
MODEL = "smollm2"


def diff_request(index: int, *, priority: int | None, max_tokens: int) -> LLMRequest:
    """A review prompt of a small, distinct diff (shared system prompt, different chunk)."""
    patch = (
        f"@@ -{index + 1},3 +{index + 1},4 @@\n def handler_{index}(event):\n"
        f"-    return event['value_{index}']\n"
        f"+    value = event.get('value_{index}')\n"
        f"+    return value * {index + 2}\n"
    )
    files = [{"path": f"src/handler_{index}.py", "patch": patch, "additions": 2, "deletions": 1}]
    return LLMRequest(
        messages=build_messages(files),
        max_tokens=max_tokens,
        temperature=0.0,
        priority=priority,
        metadata={"job_id": index},
    )


@dataclass
class Throughput:
    concurrency: int
    requests: int
    wall_s: float
    completion_tokens: int
    prompt_tokens: int
    mean_latency_s: float

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.wall_s

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s


async def measure_throughput(
    url: str, concurrency: int, requests: int, max_tokens: int
) -> Throughput:
    """Send `requests` requests with `concurrency` in flight."""
    backend = OpenAICompatBackend([url], model=MODEL, timeout_s=900, max_retries=0)
    queue = list(range(requests))
    latencies: list[float] = []
    completion_tokens = prompt_tokens = 0

    async def worker() -> None:
        nonlocal completion_tokens, prompt_tokens
        while queue:
            index = queue.pop(0)
            response = await backend.complete(
                diff_request(1000 * concurrency + index, priority=None, max_tokens=max_tokens)
            )
            latencies.append(response.latency_s)
            completion_tokens += response.completion_tokens
            prompt_tokens += response.prompt_tokens

    started = time.monotonic()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await backend.close()
    return Throughput(
        concurrency=concurrency,
        requests=requests,
        wall_s=time.monotonic() - started,
        completion_tokens=completion_tokens,
        prompt_tokens=prompt_tokens,
        mean_latency_s=statistics.fmean(latencies),
    )


@dataclass
class QueueResult:
    mode: str
    urgent_latency_s: float
    background_mean_s: float
    background: int


async def measure_urgent(
    url: str, *, pass_priority: bool, background: int, max_tokens: int, head_start_s: float
) -> QueueResult:
    """Latency of one priority-0 request sent after `background` priority-3 ones have queued."""
    backend = OpenAICompatBackend(
        [url], model=MODEL, timeout_s=900, max_retries=0, pass_priority=pass_priority
    )
    try:
        low = [
            asyncio.create_task(
                backend.complete(diff_request(500 + n, priority=3, max_tokens=max_tokens))
            )
            for n in range(background)
        ]
        await asyncio.sleep(head_start_s)  # real time: the background must be inside the engine
        urgent = await backend.complete(diff_request(999, priority=0, max_tokens=max_tokens))
        done = await asyncio.gather(*low)
    finally:
        await backend.close()
    return QueueResult(
        mode="priority passed" if pass_priority else "priority not passed (FCFS)",
        urgent_latency_s=urgent.latency_s,
        background_mean_s=statistics.fmean(r.latency_s for r in done),
        background=background,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def server(max_num_seqs: int | None) -> Iterator[str]:
    """Start a CPU vLLM server with scripts/vllm_cpu.sh; stop its process group afterwards."""
    port = free_port()
    command = [str(SCRIPT), "serve", "--port", str(port), "--timeout", "900"]
    command += ["--watch-pid", str(os.getpid())]
    if max_num_seqs:
        command += ["--max-num-seqs", str(max_num_seqs)]
    started = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise SystemExit(f"server did not start:\n{run.stderr[-3000:]}")
    values = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
    print(
        f"server (max-num-seqs {max_num_seqs or 'default'}) ready in "
        f"{time.monotonic() - started:.0f} s",
        file=sys.stderr,
    )
    pid = int(values["PID"])
    try:
        yield values["URL"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)


async def run_throughput(url: str, max_tokens: int, per_slot: int) -> list[Throughput]:
    await measure_throughput(url, 1, 1, max_tokens)  # warm-up, not reported
    return [
        await measure_throughput(url, concurrency, max(3, concurrency * per_slot), max_tokens)
        for concurrency in (1, 4, 8)
    ]


async def run_queue(url: str, max_tokens: int, background: int) -> list[QueueResult]:
    results = []
    for pass_priority in (False, True):
        results.append(
            await measure_urgent(
                url,
                pass_priority=pass_priority,
                background=background,
                max_tokens=max_tokens,
                head_start_s=1.0,
            )
        )
    return results


def main() -> int:
    """Run both measurements and print markdown tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--throughput-url")
    parser.add_argument("--queue-url", help="a server started with a small --max-num-seqs")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--per-slot", type=int, default=2, help="requests per concurrent slot")
    parser.add_argument("--background", type=int, default=8, help="low-priority requests queued")
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        url = args.throughput_url or stack.enter_context(server(None))
        throughput = asyncio.run(run_throughput(url, args.max_tokens, args.per_slot))
    with contextlib.ExitStack() as stack:
        url = args.queue_url or stack.enter_context(server(2))
        queue = asyncio.run(run_queue(url, args.max_tokens, args.background))

    print(f"\n### CPU vLLM, SmolLM2-135M, max_tokens={args.max_tokens}\n")
    print("| concurrency | requests | wall s | requests/s | completion tokens/s | mean latency s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in throughput:
        print(
            f"| {row.concurrency} | {row.requests} | {row.wall_s:.1f} | {row.requests_per_s:.2f} "
            f"| {row.tokens_per_s:.1f} | {row.mean_latency_s:.1f} |"
        )
    print(f"\n### Priority-0 request behind {args.background} priority-3 ones (max-num-seqs 2)\n")
    print("| mode | urgent latency s | background mean latency s |")
    print("|---|---:|---:|")
    for result in queue:
        print(f"| {result.mode} | {result.urgent_latency_s:.1f} | {result.background_mean_s:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
