"""A stand-in for a model server: what a replica of an inference service runs in tests and benchmarks.

    python -m hsched.examples.serve.standin [--port P] [--load-s S] [--speed X | --gpu-type T]
                                            [--max-batch B] [--prefill-ms MS] [--decode-ms MS]

It is NOT a model server. It answers like one in time only: `POST /generate` with
{"context_tokens": N, "generated_tokens": M} is answered after the service time hsched's model gives
(hsched.sched.servicetime, the same model the simulator's services use): alone, a request takes
(N x prefill + M x decode) / speed seconds, speed being the GPU type's relative inference throughput (V100 = 1);
the replica serves up to max_batch requests at once (continuous batching), each slowed by 1 + alpha (b - 1) while
b are in service, and queues the rest FIFO. The model is computed exactly as requests come and go
(`ReplicaQueue`), and every answer is timed by the event loop against it; the answer is JSON with the tokens
"generated" (a count, no text), the model's alone-time and the seconds the request spent queued and in service.

`GET /health` answers 200 once the simulated load time (--load-s, loading weights) has passed, 503 before: it is
the replica's readiness path. The port is $HSCHED_PORT (what `hsched serve` gives each replica) or --port; the GPU
type is $HSCHED_GPU_MODEL (what hsched sets for a run) unless --speed or --gpu-type say otherwise. SIGTERM stops
it at once (the router drains a replica before it is stopped, so nothing is in flight by then).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence

from aiohttp import web

from hsched.sched.servicetime import ReplicaQueue, ServiceModel, relative_speed, service_time_s


class Standin:
    """The replica's state: the model's queue, one timer for its next completion, the futures of the requests
    waiting for theirs. Runs on one event loop."""

    def __init__(self, model: ServiceModel, speed: float, *, load_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self.speed = speed
        self.clock = clock
        self.ready_at = clock() + load_s
        self.queue = ReplicaQueue(model, t=clock())
        self.waiting: dict[int, asyncio.Future[float]] = {}
        self.ids = itertools.count()
        self.timer: asyncio.TimerHandle | None = None
        self.served = 0

    def submit(self, context_tokens: int, generated_tokens: int) -> tuple[asyncio.Future[float], float]:
        """Start a request now: the future of its finish time (the model's clock), and its alone service time."""
        work = service_time_s(context_tokens, generated_tokens, self.model, self.speed, batch=1)
        rid = next(self.ids)
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        self._settle(self.queue.arrive(self.clock(), rid, work))
        self._arm()
        return fut, work

    def _settle(self, done: Sequence[tuple[object, float]]) -> None:
        for rid, at in done:
            fut = self.waiting.pop(rid, None)  # type: ignore[call-overload]
            if fut is not None and not fut.done():
                self.served += 1
                fut.set_result(at)

    def _arm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        nxt = self.queue.next_finish()
        if nxt is not None:
            loop = asyncio.get_running_loop()
            # the model's clock and the loop's are both monotonic seconds: wait the difference
            self.timer = loop.call_later(max(0.0, nxt - self.clock()), self._tick)

    def _tick(self) -> None:
        self.timer = None
        self._settle(self.queue.advance(max(self.clock(), self.queue.t)))
        self._arm()

    # ------------------------------------------------------------------------------------------ HTTP

    async def health(self, request: web.Request) -> web.Response:
        if self.clock() < self.ready_at:
            return web.Response(status=503, text="loading\n")
        return web.Response(text="ok\n")

    async def generate(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            ctx, gen = int(body["context_tokens"]), int(body["generated_tokens"])
            if ctx < 0 or gen < 0:
                raise ValueError("negative")
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": 'expected {"context_tokens": N >= 0, "generated_tokens": M >= 0}'},
                                     status=400)
        if self.clock() < self.ready_at:
            return web.json_response({"error": "loading"}, status=503, headers={"Retry-After": "1"})
        start = self.clock()
        fut, alone = self.submit(ctx, gen)
        await fut
        return web.json_response({"generated_tokens": gen, "alone_s": alone, "latency_s": self.clock() - start,
                                  "replica": os.environ.get("HSCHED_REPLICA", "")})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_post("/generate", self.generate)
        return app


def speed_from(args: argparse.Namespace, env: dict[str, str]) -> float:
    """--speed, else --gpu-type's, else $HSCHED_GPU_MODEL's relative inference speed (unknown or none: 1.0)."""
    if args.speed is not None:
        return float(args.speed)
    gpu = args.gpu_type or env.get("HSCHED_GPU_MODEL") or None
    return relative_speed(gpu)


async def serve(host: str, port: int, standin: Standin, started: Callable[[int], None] | None = None) -> None:
    runner = web.AppRunner(standin.app(), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = int(runner.addresses[0][1])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # the handlers before the line that says it listens: a SIGTERM right after it (a scale-down) ended the process by
    # the signal's default instead of a clean stop (tests/serve/test_standin.py saw exit -15)
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if started is not None:
        started(bound)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="standin", description="a stand-in model server (see the module's docstring)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=None, help="default $HSCHED_PORT")
    ap.add_argument("--load-s", type=float, default=0.0, help="simulated load time before /health is ready")
    ap.add_argument("--speed", type=float, default=None, help="relative GPU speed (V100 = 1)")
    ap.add_argument("--gpu-type", default=None, help="GPU type whose speed to use (default $HSCHED_GPU_MODEL)")
    defaults = ServiceModel()
    ap.add_argument("--max-batch", type=int, default=defaults.max_batch)
    ap.add_argument("--batch-alpha", type=float, default=defaults.batch_alpha)
    ap.add_argument("--prefill-ms", type=float, default=defaults.prefill_s * 1000, help="per context token")
    ap.add_argument("--decode-ms", type=float, default=defaults.decode_s * 1000, help="per generated token")
    args = ap.parse_args(argv)
    port = args.port
    if port is None:
        text = os.environ.get("HSCHED_PORT", "")
        if not text.isdigit():
            print("standin: no port: pass --port or set HSCHED_PORT (hsched serve sets it for each replica)",
                  file=sys.stderr)
            return 2
        port = int(text)
    model = ServiceModel(prefill_s=args.prefill_ms / 1000, decode_s=args.decode_ms / 1000,
                         max_batch=args.max_batch, batch_alpha=args.batch_alpha)
    if problems := model.problems():
        print(f"standin: {'; '.join(problems)}", file=sys.stderr)
        return 2
    if args.speed is not None and args.speed <= 0:
        print("standin: --speed must be > 0", file=sys.stderr)
        return 2
    standin = Standin(model, speed_from(args, dict(os.environ)), load_s=args.load_s)

    def started(bound: int) -> None:
        print(json.dumps({"port": bound, "speed": standin.speed, "max_batch": model.max_batch}), flush=True)

    asyncio.run(serve(args.host, port, standin, started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
