"""The dispatcher: fills worker slots with chunks the MLFQ picks, and keeps the queue moving.

Its steps are in bot/sched/steps.py; this is the live loop around them: wake-ups (LISTEN/NOTIFY
and a slow poll), one task per running chunk, heartbeats, and a graceful stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime

from bot.errors import LeaseLost, LLMError, LLMRequestRejected, StoreError
from bot.lifecycle import cancelled_at_stop, running
from bot.model import Job
from bot.outage import OutageWatch
from bot.queue.connector import Listener
from bot.queue.store import Leased
from bot.sched.mlfq import SCHEDULING_POLICIES, SchedulingPolicy
from bot.sched.ports import ReviewedChunk
from bot.sched.presence import Presence, backend_engines, keep_present
from bot.sched.steps import DispatcherCore, DispatcherSettings, level_counts, settings_for

log = logging.getLogger(__name__)


def install_signal_handlers(dispatcher: Dispatcher) -> None:
    """SIGTERM and SIGINT make the dispatcher stop taking work and hand back what it holds."""
    import signal

    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, dispatcher.stop)


class Dispatcher(DispatcherCore):
    """The dispatcher running live: chunks start as slots free and work arrives."""

    def wake(self) -> None:
        """Ask the loop to look at the queue now (NOTIFY arrived, a slot freed)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop taking work; running chunks finish or are released (see run)."""
        if not self._stopping.is_set():
            # The drain reports what became of the chunks running when the stop was asked
            # for: the ones that end before the loop reaches the drain ended within the grace.
            self._running_at_stop = set(self.held)
        self._stopping.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def _run_chunk(self, leased: Leased) -> None:
        """Live mode: run one chunk; whatever goes wrong, its slot is freed and the error kept."""
        chunk = leased.chunk
        try:
            await self._review_and_store(leased)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Not an outcome the chunk reviewer knows (a bug, a backend raising something of its
            # own, the database going away): the attempt counts, with its error on the chunk.
            log.exception(
                "chunk %s of job %s failed unexpectedly",
                chunk.id,
                chunk.job_id,
                extra={"action": "chunk_crashed", "job_id": chunk.job_id},
            )
            await self._record_crash(leased, exc)
        finally:
            self._started.discard(chunk.id)
            self._wake.set()

    async def _record_crash(self, leased: Leased, error: Exception) -> None:
        """Free the slot and count the attempt; if the store is away too, the lease expires."""
        chunk = leased.chunk
        self.held.pop(chunk.id, None)
        if self.engines is not None:
            self.engines.abandoned(chunk.id, self.clock.now())
        try:
            outcome = await self.store.fail_chunk(
                chunk.id,
                owner=self.settings.owner,
                now=self.clock.now(),
                error=f"{type(error).__name__}: {error}",
                retryable=True,
                attempt=chunk.lease_attempt,
            )
        except LeaseLost:
            return  # finished or taken over before the failure: nothing to count
        except StoreError as exc:
            log.warning(
                "chunk %s: failure not recorded, its lease will expire: %s",
                chunk.id,
                exc,
                extra={"action": "chunk_failure_unrecorded", "job_id": chunk.job_id},
            )
            return
        if outcome.job_dead and self.metrics is not None:
            self.metrics.count_dead()

    async def _review_and_store(self, leased: Leased) -> None:
        """Review one chunk through the injected reviewer and store what it found."""
        job = await self.store.get_job(leased.chunk.job_id)
        if self.metrics is not None and job is not None and leased.first_start:
            started = leased.chunk.started_at or self.clock.now()
            ready = job.ready_at or job.enqueued_at
            self.metrics.observe_wait(job.base_level, (started - ready).total_seconds())
        call = asyncio.ensure_future(self.review(job, leased))
        self._calls[leased.chunk.id] = call
        try:
            review = await call
        except LLMRequestRejected as exc:
            if self.engines is not None:
                await self.engines.failed(leased.chunk.id, self.clock.now(), overloaded=False)
            # This model cannot review this part (e.g. a prompt over its context length);
            # the rest of the review goes on and its summary names the part and why.
            log.warning(
                "chunk %s refused by the model server: %s",
                leased.chunk.id,
                exc,
                extra={"action": "chunk_refused", "job_id": leased.chunk.job_id},
            )
            await self.finish_chunk(
                leased,
                gpu_seconds=0.0,
                result={"status": "failed", "error": f"the model server refused it: {exc}"},
                now=self.clock.now(),
            )
            return
        except LLMError as exc:
            if self.engines is not None:
                await self.engines.failed(
                    leased.chunk.id, self.clock.now(), overloaded=exc.overloaded
                )
            await self.fail(leased, exc, self.clock.now())
            return
        except asyncio.CancelledError:
            if self.engines is not None:
                self.engines.abandoned(leased.chunk.id, self.clock.now())
            current = asyncio.current_task()
            preempted = leased.chunk.id in self._preempted
            if preempted and (current is None or not current.cancelling()):
                return  # preempted: the chunk is queued again and its slot serves P0
            raise
        finally:
            self._calls.pop(leased.chunk.id, None)
            self._preempted.discard(leased.chunk.id)
        gpu_seconds = review.gpu_seconds
        if self.engines is not None:
            # Under batching a call's latency is not its cost: charge its share of the engine.
            usage = review.usage
            shared = await self.engines.finished(
                leased.chunk.id,
                self.clock.now(),
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
            )
            # A backend that measured wall time says GPU seconds = latency: under batching the
            # call gets its share instead. One that charges a cost model has said its cost.
            if shared is not None and usage.gpu_seconds == usage.latency_s:
                gpu_seconds = shared
        result = review.to_result()
        if self.metrics is not None:
            usage = review.usage
            self.metrics.observe_chunk(self.settings.owner, gpu_seconds)
            self.metrics.observe_llm(usage.latency_s, usage.prompt_tokens, usage.completion_tokens)
            self.metrics.count_anchoring(result.get("anchoring") or {})
        await self.finish_chunk(
            leased,
            gpu_seconds=gpu_seconds,
            result=result,
            now=self.clock.now(),
        )

    async def review(self, job: Job | None, leased: Leased) -> ReviewedChunk:
        """Review one chunk through the injected reviewer, on the engine its lease names."""
        engine = self.engines.engine_of(leased.chunk.id) if self.engines is not None else None
        return await self.reviewer(job, leased, engine)

    def presence(self) -> Presence:
        """This dispatcher's row in `dispatchers`: its slots, running chunks and engines."""
        return Presence(
            self.store.monitoring,
            name=self.settings.owner,
            slots=self.total_slots,
            engines=lambda: backend_engines(self.backend, self.engines),
            running=lambda: len(self.held),
        )

    async def _heartbeat_loop(self, outage: OutageWatch) -> None:
        """Renew this process's leases and take back other processes' expired ones, every
        heartbeat: a dead dispatcher's chunks run again within about one lease."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            try:
                await self.heartbeat(self.clock.now())
            except StoreError as exc:
                # The leases run out if this goes on; others then take the chunks over.
                outage.lost(exc)

    async def heartbeat(self, now: datetime) -> int:
        """Renew held leases, then reclaim expired ones; returns how many were reclaimed."""
        if self.held:
            await self.store.heartbeat(
                list(self.held), owner=self.settings.owner, now=now, lease_s=self.settings.lease_s
            )
        reclaimed = await self.store.reclaim_expired(now=now)
        if reclaimed and self.metrics is not None:
            self.metrics.count_reclaims(reclaimed)
        return reclaimed

    async def drain(self, grace_s: float) -> tuple[int, int]:
        """Let running chunks finish for up to `grace_s`, then cancel the rest and hand every
        chunk still held back to the queue (no attempt counted), so other dispatchers take
        them at once instead of after the lease. Returns (finished, handed back): every chunk
        running since the stop was asked for either finished or was handed back."""
        running = len(self._running_at_stop | set(self.held))
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        try:
            released = await self.release_all(self.clock.now(), reason="handed back at shutdown")
        except StoreError as exc:
            log.warning(
                "chunks not handed back (their leases expire instead): %s",
                exc,
                extra={"action": "release_failed"},
            )
            released = 0
        finished = max(0, running - released)
        log.info(
            "drained: %d running chunks ended within %.0f s, %d handed back",
            finished,
            grace_s,
            released,
            extra={"action": "dispatcher_drained", "finished": finished, "released": released},
        )
        return finished, released

    async def _listen(self, database_url: str | None, *, quiet: bool = False) -> Listener | None:
        """LISTEN for work through the store, given `database_url`."""
        if database_url is None:
            return None
        try:
            return await self.store.listen_for_work(self._wake.set)
        except StoreError as exc:
            if not quiet:
                log.warning(
                    "LISTEN unavailable, polling every %ss: %s",
                    self.settings.poll_s,
                    exc,
                    extra={"action": "listen_failed"},
                )
            return None

    async def _step(self, loop: asyncio.AbstractEventLoop) -> None:
        """One pass of the loop: maintenance when due, planning, filling free slots."""
        if loop.time() >= self._next_maintenance:
            await self.maintain(self.clock.now())
            self._next_maintenance = loop.time() + self.settings.maintenance_s
        await self._plan_until_stopped()
        # Read the clock again: work submitted while we planned must not appear to
        # start before it arrived.
        try:
            await self.fill_slots(self.clock.now())
        finally:
            # Even when a later statement of the pass failed, what was leased runs: a leased
            # chunk without a task would keep its slot (and, heartbeat after heartbeat, its
            # lease) for ever.
            self._start_leased()

    async def _plan_until_stopped(self) -> None:
        """Plan unplanned jobs; a stop cuts planning short (a batch of diffs can take
        seconds), and the planning claims it leaves are given up on the way out."""
        if self._stopping.is_set():
            return
        planning = asyncio.ensure_future(self.plan_unplanned_jobs(self.clock.now()))
        stopped = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({planning, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not planning.done():
                planning.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await planning
        if not planning.cancelled():
            planning.result()  # its errors are the loop's (a database outage backs off)

    def _start_leased(self) -> None:
        for chunk_id, leased in list(self.held.items()):
            if chunk_id in self._started or chunk_id in self._parked:
                continue
            self._started.add(chunk_id)
            task = asyncio.create_task(self._run_chunk(leased))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pause(self, seconds: float) -> None:
        """Wait `seconds`, or less when stop() is called."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)

    async def run(
        self, *, database_url: str | None = None, shutdown_grace_s: float | None = None
    ) -> None:
        """Serve until stop(): wake on NOTIFY (or the poll), fill slots, run chunks.

        A database outage never ends the loop: it backs off (with jitter), says so once, and
        carries on when the database is back; the LISTEN connection is opened again then.
        After stop() it drains (see `drain`) within `shutdown_grace_s` (default: the
        settings').
        """
        listener = await self._listen(database_url)
        self._live = True
        outage = OutageWatch(
            f"dispatcher {self.settings.owner}", base_s=self.settings.outage_backoff_s
        )
        # Leases are renewed, and the dispatcher shown alive, until the drain has ended.
        beating = [
            cancelled_at_stop("lease-heartbeat", lambda: self._heartbeat_loop(outage)),
            cancelled_at_stop(
                "presence",
                lambda: keep_present(
                    self.presence(), clock=self.clock, interval_s=self.settings.heartbeat_s
                ),
            ),
        ]
        self._next_maintenance = 0.0
        loop = asyncio.get_running_loop()
        try:
            async with running(beating):
                while not self._stopping.is_set():
                    self._wake.clear()
                    try:
                        await self._step(loop)
                    except StoreError as exc:
                        await self._pause(outage.lost(exc))
                        continue
                    outage.recovered()
                    if database_url is not None and (listener is None or listener.is_closed()):
                        # The server restarted (or was away at start): NOTIFY wakes us again.
                        listener = await self._listen(database_url, quiet=listener is None)
                    timeout = self.settings.poll_s
                    if self.recheck_at is not None:
                        until_recheck = (self.recheck_at - self.clock.now()).total_seconds()
                        timeout = min(timeout, max(0.0, until_recheck))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout=timeout)
                grace_s = shutdown_grace_s
                await self.drain(self.settings.shutdown_grace_s if grace_s is None else grace_s)
        finally:
            if listener is not None and not listener.is_closed():
                await listener.close()


__all__ = [
    "SCHEDULING_POLICIES",
    "Dispatcher",
    "DispatcherSettings",
    "SchedulingPolicy",
    "install_signal_handlers",
    "level_counts",
    "settings_for",
]
