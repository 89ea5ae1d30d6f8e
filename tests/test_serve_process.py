"""`memdistill serve` owns its children: SIGTERM stops every server it started; kill -9 on the launcher takes
them down too (the kernel's parent-death signal), so the next `make serve` finds its ports free."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from memdistill.serve.server import free_port

REPO = Path(__file__).resolve().parents[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "kill -9"])
def test_stopping_memdistill_serve_leaves_no_server_behind(sig, tmp_path):
    port, front_port = free_port(), free_port()
    log = open(tmp_path / "serve.log", "w")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "memdistill", "serve", "--config", "configs/serving/cpu.yaml", f"port={port}",
         f"extractor={tmp_path / 'not-trained'}", "max_model_len=1024", "router=null", "planner=null", "gate=null",
         "consolidator=null", f"front={{port: {front_port}, log: null}}"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    children: list[psutil.Process] = []
    try:
        deadline = time.time() + 900
        while not _up(f"http://127.0.0.1:{front_port}/health"):
            assert launcher.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.time() < deadline, "memdistill serve did not come up"
            time.sleep(2)
        children = psutil.Process(launcher.pid).children(recursive=True)
        commands = [" ".join(c.cmdline()) for c in children]
        assert any("vllm.entrypoints.openai.api_server" in c for c in commands), commands
        assert any("memdistill front" in c for c in commands), commands
        assert _listening(port) and _listening(front_port)

        os.kill(launcher.pid, sig)
        launcher.wait(timeout=120)
        if sig == signal.SIGTERM:
            assert launcher.returncode == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(children, timeout=120)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert alive == [], [" ".join(p.cmdline()) for p in alive]
        assert not _listening(port) and not _listening(front_port)
    finally:  # whatever the outcome, nothing this test started outlives it
        for p in [launcher_proc(launcher), *children]:
            if p is not None and p.is_running():
                p.kill()


def launcher_proc(p: subprocess.Popen):
    try:
        return psutil.Process(p.pid) if p.poll() is None else None
    except psutil.NoSuchProcess:
        return None


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
