#!/usr/bin/env python3
"""A buddy allocator as sglang's Python side keeps one (power-of-two blocks,
1 MiB minimum, pool rounded up to a power of two, free lists per order, a
table of live slots), timed on the workloads `ferry bench slots` runs:

  pairs  allocate then free at once, sizes 1..64 MiB in turn
  churn  a random mix over a 1 GiB pool: allocate 1..64 MiB (when full, free
         a random live slot instead) or free a random live slot

Both sides draw from the same 64-bit LCG, so the request streams match.
sglang's own allocator file is not in shared/; this is the textbook
free-list algorithm it describes, written as plainly fast Python.

Prints one JSON object of ops/s per workload.
"""

import argparse
import json
import time

MIB = 1 << 20


class BuddyAllocator:
    def __init__(self, pool_size, min_block=MIB):
        size = 1 << (pool_size - 1).bit_length()
        self.min_block = min_block
        self.max_order = (size // min_block).bit_length() - 1
        self.free = [set() for _ in range(self.max_order + 1)]
        self.free[self.max_order].add(0)
        self.live = {}

    def allocate(self, size):
        blocks = -(-size // self.min_block)
        order = (blocks - 1).bit_length()
        k = order
        while k <= self.max_order and not self.free[k]:
            k += 1
        if k > self.max_order:
            return None
        offset = self.free[k].pop()
        while k > order:
            k -= 1
            self.free[k].add(offset + (self.min_block << k))
        self.live[offset] = order
        return offset

    def free_slot(self, offset):
        order = self.live.pop(offset)
        while order < self.max_order:
            buddy = offset ^ (self.min_block << order)
            if buddy not in self.free[order]:
                break
            self.free[order].remove(buddy)
            offset = min(offset, buddy)
            order += 1
        self.free[order].add(offset)


class Lcg:
    """Knuth's MMIX LCG; the same stream as ferry's bench."""

    def __init__(self, seed):
        self.state = seed

    def next(self):
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        return self.state >> 33


def pairs(seconds):
    a = BuddyAllocator(1 << 30)
    ops = 0
    i = 0
    start = time.perf_counter()
    while True:
        for _ in range(1024):
            off = a.allocate((i % 64 + 1) * MIB)
            a.free_slot(off)
            i += 1
        ops += 2048
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return ops / elapsed


def churn(seconds):
    a = BuddyAllocator(1 << 30)
    rng = Lcg(42)
    live = []
    ops = 0
    start = time.perf_counter()
    while True:
        for _ in range(1024):
            r = rng.next()
            if live and r & 1:
                j = rng.next() % len(live)
                live[j], live[-1] = live[-1], live[j]
                a.free_slot(live.pop())
            else:
                off = a.allocate((rng.next() % 64 + 1) * MIB)
                if off is None:
                    j = rng.next() % len(live)
                    live[j], live[-1] = live[-1], live[j]
                    a.free_slot(live.pop())
                else:
                    live.append(off)
        ops += 1024
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return ops / elapsed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    print(json.dumps({
        "pairs": {"per_second": round(pairs(args.seconds), 1)},
        "churn": {"per_second": round(churn(args.seconds), 1)},
    }))


if __name__ == "__main__":
    main()
