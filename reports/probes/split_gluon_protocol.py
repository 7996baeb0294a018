"""Check the barrier protocols of reports/probes/split_gluon.py's kernels by simulation, before a GPU hangs on them.

A Gluon kernel that waits on the wrong mbarrier phase does not fail: it hangs, and a hung device call runs to its
time limit. This script models the protocols in plain Python under random interleavings and asserts that every
wait is satisfied by the load it means, that no ring slot is refilled while a wgmma may still read it, and that
nothing deadlocks:

- ``deferred``: split_gluon_deferred_kernel's single-partition ring (its first version loaded one step too few
  in the prologue and deadlocked on the H200: run W);
- ``pingpong``: split_gluon_pingpong_kernel's producer and two consumers, with and without the turn barriers
  (without them a consumer waits on a slot several phases ahead, and a parity wait cannot tell those phases
  apart: it passes on a stale load, which the simulation catches; run Y hung).

The model of an mbarrier: a count of completed phases P; ``wait(parity)`` passes iff ``P & 1 != parity`` (a
parity wait names the most recent phase of that parity, which is complete unless it is the current one).

Usage: python -m reports.probes.split_gluon_protocol
"""
from __future__ import annotations

import random
from collections.abc import Generator


class Barrier:
    """An mbarrier with ``count`` arrivals per phase."""

    def __init__(self, count: int = 1) -> None:
        self.count = count
        self.pending = count
        self.completed = 0

    def arrive(self) -> None:
        """One arrival; the last one of a phase completes it."""
        self.pending -= 1
        if self.pending == 0:
            self.completed += 1
            self.pending = self.count

    def passes(self, parity: int) -> bool:
        """Whether ``wait(parity)`` returns now."""
        return (self.completed & 1) != parity


def _schedule(agents: list[Generator[None, None, None]], rnd: random.Random, limit: int = 10**6) -> str:
    """Run the agents in a random interleaving; "ok" when all finish, "DEADLOCK" past ``limit`` steps."""
    alive = list(agents)
    for _ in range(limit):
        if not alive:
            return "ok"
        agent = rnd.choice(alive)
        try:
            next(agent)
        except StopIteration:
            alive.remove(agent)
    return "DEADLOCK"


def pingpong(my_tiles: int, k_tiles: int, stages: int, seed: int, turns: bool = True) -> str:
    """The producer and the two consumers of split_gluon_pingpong_kernel for one program."""
    rnd = random.Random(seed)
    ready = [Barrier() for _ in range(stages)]
    empty = [Barrier() for _ in range(stages)]
    turn = [Barrier(), Barrier()]
    holds: dict[int, int] = {}  # slot -> the step loaded into it
    reading: dict[int, int] = {}  # slot -> the step a wgmma may still be reading from it

    def producer() -> Generator[None, None, None]:
        slot, phase = 0, 0
        for step in range(my_tiles * k_tiles):
            while not empty[slot].passes(phase ^ 1):
                yield
            assert slot not in reading, f"slot {slot} refilled while step {reading[slot]} may still be read"
            holds[slot] = step
            ready[slot].arrive()
            yield
            slot += 1
            if slot == stages:
                slot, phase = 0, phase ^ 1

    def consumer(wg: int) -> Generator[None, None, None]:
        n = 0
        for j in range(wg, my_tiles, 2):
            if turns and j > 0:
                while not turn[wg].passes((n - (1 - wg)) & 1):
                    yield
            step = j * k_tiles
            slot, phase, prev = step % stages, (step // stages) & 1, None
            for kk in range(k_tiles):
                while not ready[slot].passes(phase):
                    yield
                assert holds.get(slot) == step + kk, (f"consumer {wg} took slot {slot} holding step "
                                                      f"{holds.get(slot)} for step {step + kk}")
                reading[slot] = step + kk
                yield
                if prev is not None:  # wgmma_wait(1): the previous step's wgmma is done
                    del reading[prev]
                    empty[prev].arrive()
                prev = slot
                slot += 1
                if slot == stages:
                    slot, phase = 0, phase ^ 1
            yield
            del reading[prev]
            empty[prev].arrive()
            if turns:
                turn[1 - wg].arrive()
            n += 1
            for _ in range(rnd.randint(0, 5)):  # the epilogue
                yield

    return _schedule([producer(), consumer(0), consumer(1)], rnd)


def deferred(my_tiles: int, k_tiles: int, stages: int, prologue: int | None = None) -> str:
    """split_gluon_deferred_kernel's ring for one program (one partition: a fixed order, no interleaving).
    ``prologue``: how many steps the prologue loads (the kernel's: ``stages``; its first version's: stages-1)."""
    p = stages - 1
    total = my_tiles * k_tiles
    loaded: set[int] = set()
    done = -1  # every step up to this one has had its wgmma complete
    ld_pos = 0

    def load(pos: int) -> None:
        assert pos - stages <= done, f"step {pos} refills the slot of step {pos - stages}, not yet complete"
        loaded.add(pos)

    for _ in range(stages if prologue is None else prologue):
        if ld_pos < total:
            load(ld_pos)
        ld_pos += 1
    g = 0
    for _ in range(my_tiles):
        for _ in range(p):  # (a) issued without waiting for completions
            if g not in loaded:
                return "DEADLOCK"
            g += 1
        for _ in range(p, k_tiles):  # (c)
            if g not in loaded:
                return "DEADLOCK"
            done = g - 1
            while ld_pos < g + stages and ld_pos < total:
                load(ld_pos)
                ld_pos += 1
            g += 1
        done = g - 1
        while ld_pos < g + stages and ld_pos < total:
            load(ld_pos)
            ld_pos += 1
    return "ok"


def main() -> None:
    """Print the outcome of each protocol over many shapes and interleavings; exit 1 if the kernels' own fail."""
    shapes = ((1, 10, 3), (2, 10, 3), (5, 10, 3), (6, 10, 6), (7, 4, 3), (3, 3, 3), (9, 10, 2), (124, 10, 3))
    failed = False
    for label, turns in (("ping-pong with turn barriers (the kernel)", True), ("ping-pong without them", False)):
        outcomes: set[str] = set()
        for seed in range(50):
            for shape in shapes:
                try:
                    outcomes.add(pingpong(*shape, seed=seed, turns=turns))
                except AssertionError as exc:
                    outcomes.add(f"wrong: {exc}")
        print(f"{label}: {sorted(outcomes)[:3]}")
        failed |= turns and outcomes != {"ok"}
    for label, prologue in (("deferred, prologue of STAGES steps (the kernel)", None),
                            ("deferred, prologue of STAGES-1 steps (run W)", -1)):
        outcomes = set()
        for my_tiles, k_tiles, stages in shapes:
            if k_tiles < stages - 1:
                continue
            try:
                outcomes.add(deferred(my_tiles, k_tiles, stages, None if prologue is None else stages - 1))
            except AssertionError as exc:
                outcomes.add(f"wrong: {exc}")
        print(f"{label}: {sorted(outcomes)}")
        failed |= prologue is None and outcomes != {"ok"}
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
