"""Progress to the control plane over HTTP: batched, in a background thread, never blocking.

Used by :mod:`trainguard.train.progress` when ``TRAINGUARD_PROGRESS`` is an
``http://`` or ``https://`` URL, normally ``http://HOST:8470/v1/jobs/<job id>/progress``
(what ``trainguard serve`` gives the jobs it manages). The token, when the
server needs one, is ``TRAINGUARD_PROGRESS_TOKEN`` (an ``agent`` token).

* :meth:`HttpBatcher.offer` puts the event's JSON on a bounded queue and returns at
  once; a full queue drops the event (counted): training never waits for us.
* A daemon thread sends everything queued as one ``POST {"events": [...]}`` every
  ``interval`` seconds (at most :data:`MAX_BATCH` events per request), with
  ``urllib`` (no third-party import in the training process).
* A batch that fails is retried with backoff while newer events keep queueing;
  after :data:`MAX_TRIES` it is dropped (newer progress supersedes it) and a
  warning is logged once. A busy server's 429 is not a failure: the batch is sent
  again after the ``Retry-After`` it names (for at most :data:`MAX_THROTTLED_S`
  seconds in all), without using up a try.
* At interpreter exit what is queued gets one last, short attempt, so the last
  steps of a finished job arrive.

Nothing here raises into the caller.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import urllib.error
import urllib.request

log = logging.getLogger("trainguard.train")

TOKEN_ENV = "TRAINGUARD_PROGRESS_TOKEN"
MAX_QUEUE = 10_000
MAX_BATCH = 1000
MAX_TRIES = 4
INTERVAL_S = 0.5
TIMEOUT_S = 5.0
MAX_THROTTLED_S = 60.0  # how long one batch waits out a busy server's 429s in all


class HttpBatcher:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        interval: float = INTERVAL_S,
        max_queue: int = MAX_QUEUE,
        timeout: float = TIMEOUT_S,
    ) -> None:
        self.url = url
        self.token = token if token is not None else os.environ.get(TOKEN_ENV)
        self.interval = interval
        self.timeout = timeout
        self.queue: queue.Queue[str] = queue.Queue(maxsize=max_queue)
        self.dropped = 0
        self.sent = 0
        self.failed_posts = 0
        self.throttled = 0  # 429 answers (a busy server)
        self._retry_after: float | None = None  # of the last 429
        self._warned = False
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one sender at a time (thread or exit flush)
        self._thread = threading.Thread(target=self._run, name="trainguard-progress", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def offer(self, line: str) -> None:
        """Queue one event (its JSON text); drops it when the queue is full."""
        try:
            self.queue.put_nowait(line)
        except queue.Full:
            self.dropped += 1

    def _take(self) -> list[str]:
        out: list[str] = []
        while len(out) < MAX_BATCH:
            try:
                out.append(self.queue.get_nowait())
            except queue.Empty:
                break
        return out

    def _post(self, lines: list[str]) -> bool:
        body = ('{"events":[' + ",".join(lines) + "]}").encode()
        req = urllib.request.Request(self.url, data=body, method="POST")
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        self._retry_after = None
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                resp.read()
            return True
        except (urllib.error.URLError, OSError, ValueError) as exc:
            if isinstance(exc, urllib.error.HTTPError) and exc.code == 429:
                self.throttled += 1
                self._retry_after = _retry_after(exc.headers.get("Retry-After"))
                return False
            self.failed_posts += 1
            if (
                isinstance(exc, urllib.error.HTTPError)
                and 400 <= exc.code < 500
                and exc.code != 429
            ):
                self._warn(f"the server refused progress ({exc.code}); this batch is dropped")
                return True  # retrying a refused batch cannot help
            self._warn_once(exc)
            return False

    def _warn_once(self, exc: BaseException) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "trainguard: progress to %s failed (%s); retrying, further failures are silent",
                self.url,
                exc,
            )

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("trainguard: %s", message)

    def _send_batch(self, batch: list[str], tries: int, stop: threading.Event) -> None:
        delay = self.interval
        attempt = 0
        throttled_s = 0.0
        while attempt < tries:
            if self._post(batch):
                self.sent += len(batch)
                return
            wait = self._retry_after
            if wait is not None and throttled_s + wait <= MAX_THROTTLED_S:
                # The server is busy, not failing: wait as long as it asks, try again.
                throttled_s += wait
                if stop.wait(wait):
                    break
                continue
            attempt += 1
            if attempt < tries and stop.wait(delay):
                break
            delay = min(delay * 2, 5.0)
        self.dropped += len(batch)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with self._lock:
                    while True:
                        batch = self._take()
                        if not batch:
                            break
                        self._send_batch(batch, MAX_TRIES, self._stop)
            except Exception as exc:  # never let the thread die
                self._warn_once(exc)

    def flush(self, timeout: float = 2.0) -> None:
        """Send what is queued now (one try per batch); used at exit and by tests."""
        old = self.timeout
        self.timeout = min(old, timeout)
        try:
            with self._lock:
                while True:
                    batch = self._take()
                    if not batch:
                        break
                    self._send_batch(batch, 1, threading.Event())
        except Exception as exc:
            self._warn_once(exc)
        finally:
            self.timeout = old

    def close(self) -> None:
        self._stop.set()
        atexit.unregister(self.close)
        self.flush()


def _retry_after(value: str | None) -> float:
    """Seconds from a ``Retry-After`` header (delta seconds; 1 when absent or a date)."""
    try:
        return min(max(float(value or 1.0), 0.1), MAX_THROTTLED_S)
    except ValueError:
        return 1.0


__all__ = ["TOKEN_ENV", "HttpBatcher"]
