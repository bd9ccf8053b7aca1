"""One process of the official Mooncake Store yardstick of bench/store.

The Go side (official.go) embeds this file, writes it to a temporary
directory and runs it with the interpreter of the official wheel
(mooncake-transfer-engine-non-cuda). Its one argument is a JSON object
(officialArgs in official.go). The protocol, one JSON object per line:

  role "storage": mount a segment of `segment` bytes, print {"ready": ...},
      then idle until stdin closes.
  role "client": set up, register one batch worth of memory, preload the
      keys it owns (get only), print {"ready": ...}; on the line "go" from
      stdin, run `warmup_s` untimed and `duration_s` timed, write the
      nanoseconds of every timed call to `lat_path` (int64, native order)
      and print {"calls", "ops", "seconds"}; then wait for stdin to close.

Either role then exits at once, without closing the store (see leave).

Any failure prints {"error": "..."} and exits with status 1. Every call is a
zero-copy one on registered memory: batch_put_from / batch_get_into, or
put_from / get_into when a batch holds one object.
"""

import array
import ctypes
import json
import mmap
import os
import sys
import time

from mooncake.store import MooncakeDistributedStore, ReplicateConfig


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def fail(msg):
    say({"error": msg})
    leave(1)


def setup(a, segment):
    s = MooncakeDistributedStore()
    rc = s.setup(
        "127.0.0.1",
        a["metadata"],
        segment,
        a["local_buffer"],
        "tcp",
        "",
        a["master"],
    )
    if rc != 0:
        fail("setup returned %d" % rc)
    return s


def key(a, prefix, i):
    return "%s%012d" % (prefix, i)


class Client:
    def __init__(self, a):
        self.a = a
        self.s = setup(a, a["segment"])
        self.v = a["value_size"]
        self.b = a["batch"]
        self.n = a["clients"]
        self.i = a["index"]
        self.keys = a["keys"]
        size = self.v * self.b
        self.mem = mmap.mmap(-1, size)
        # A pattern rather than zeros, so no layer can skip the bytes.
        self.mem.write(bytes(range(256)) * (size // 256) + bytes(size % 256))
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))
        rc = self.s.register_buffer(self.addr, size)
        if rc != 0:
            fail("register_buffer returned %d" % rc)
        self.ptrs = [self.addr + j * self.v for j in range(self.b)]
        self.sizes = [self.v] * self.b
        self.cfg = ReplicateConfig()
        self.prefix = a["prefix"]
        if a["topology"] == "local":
            # Every object this client puts lives in its own segment, and it
            # reads only those: the same-host path, with no TCP between
            # processes.
            self.cfg.preferred_segment = self.s.get_hostname()
            self.prefix = "%sc%d/" % (a["prefix"], self.i)
        self.calls = 0

    def put(self, keys):
        b = len(keys)
        if b == 1:
            rc = self.s.put_from(keys[0], self.ptrs[0], self.v, self.cfg)
            if rc != 0:
                fail("put_from %s returned %d" % (keys[0], rc))
            return
        rcs = self.s.batch_put_from(keys, self.ptrs[:b], self.sizes[:b], self.cfg)
        for k, rc in zip(keys, rcs):
            if rc != 0:
                fail("batch_put_from %s returned %d" % (k, rc))

    def get(self, keys):
        if len(keys) == 1:
            rc = self.s.get_into(keys[0], self.ptrs[0], self.v)
            if rc != self.v:
                fail("get_into %s returned %d, want %d" % (keys[0], rc, self.v))
            return
        rcs = self.s.batch_get_into(keys, self.ptrs, self.sizes)
        for k, rc in zip(keys, rcs):
            if rc != self.v:
                fail("batch_get_into %s returned %d, want %d" % (k, rc, self.v))

    def preload(self):
        # Remote: each client stores its share of the working set, which
        # every client then reads. Local: each stores all of it, in its own
        # segment under its own prefix.
        lo, hi = 0, self.keys
        if self.a["topology"] != "local":
            lo, hi = self.i * self.keys // self.n, (self.i + 1) * self.keys // self.n
        for first in range(lo, hi, self.b):
            self.put([key(self.a, self.prefix, k) for k in range(first, min(first + self.b, hi))])

    def run(self, seconds, lat):
        """Calls until seconds have passed; returns (calls, elapsed)."""
        a, b = self.a, self.b
        get = a["op"] == "get"
        if get:
            names = [key(a, self.prefix, k) for k in range(self.keys)]
            names = names + names[:b]  # a batch may wrap around
        cursor = 0 if a["topology"] == "local" else self.i * self.keys // self.n
        now = time.perf_counter_ns
        start = now()
        end = start + int(seconds * 1e9)
        calls = 0
        t = start
        while t < end:
            if get:
                keys = names[cursor : cursor + b]
                cursor = (cursor + b) % self.keys
                t0 = now()
                self.get(keys)
            else:
                # Keys never stored before: a put of an existing key is a
                # no-op that reports success.
                base = self.keys + (self.calls * self.n + self.i) * b
                keys = [key(a, a["prefix"], base + j) for j in range(b)]
                self.calls += 1
                t0 = now()
                self.put(keys)
            t = now()
            if lat is not None:
                lat.append(t - t0)
            calls += 1
        return calls, (t - start) / 1e9


def client(a):
    c = Client(a)
    if a["op"] == "get":
        c.preload()
    say({"ready": True, "hostname": c.s.get_hostname()})
    if sys.stdin.readline().strip() != "go":
        leave()  # the Go side went away
    c.run(a["warmup_s"], None)
    lat = array.array("q")
    calls, seconds = c.run(a["duration_s"], lat)
    with open(a["lat_path"], "wb") as f:
        lat.tofile(f)
    say({"calls": calls, "ops": calls * c.b, "seconds": seconds})
    sys.stdin.read()
    leave()


def storage(a):
    s = setup(a, a["segment"])
    say({"ready": True, "hostname": s.get_hostname()})
    sys.stdin.read()
    leave()


def leave(status=0):
    """Ends the process at once: the master stops next, and an orderly
    close, which takes seconds to unmount a segment, would buy nothing."""
    sys.stdout.flush()
    os._exit(status)


def main():
    a = json.loads(sys.argv[1])
    if a["role"] == "storage":
        storage(a)
    else:
        client(a)


if __name__ == "__main__":
    main()
