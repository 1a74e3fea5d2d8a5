#!/usr/bin/env python3
"""Where a training step's time goes, step by step, from a kernel trace.

Records the syscall and scheduler tracepoints of a running ps-worker and
ps-server (one worker, one shard, the data port, no overlap: the step's
exchange is one PushPull frame each way) with `perf record`, then follows each
step through the threads that carry it:

  caller    the worker's training thread: compute ends at its sendmsg of the
            request frame; it waits until the answer is in, then runs the
            next step (the batch and the parameters into the model, forward,
            backward, the gradients)
  shard     the shard's connection thread: reads the frame, applies the
            update, writes the answer with one sendmsg
  reader    the worker's connection reader: reads and handles the answer
            (the parameters land in the caller's buffers) and wakes the
            caller

and prints the median of each phase over the traced steps, in ms:

  bench/step_timeline.py --worker PID --server PID [--seconds 0.5]
  bench/step_timeline.py --script FILE   # a saved `perf script` text

Needs perf with the raw_syscalls and sched tracepoints (root, or
kernel.perf_event_paranoid <= -1). Threads are told apart by what they do: the
caller and the shard thread are the ones that send frames of at least
--min_bytes, the reader the worker thread that reads them.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

SENDMSG, RECVFROM = 46, 45  # x86-64 syscall numbers

EVENT = re.compile(
    r"^\s*(?P<comm>\S+)\s+(?P<tid>\d+)\s+\[\d+\]\s+(?P<time>[\d.]+):\s+"
    r"(?P<event>\S+):\s+(?P<rest>.*)$")
ENTER = re.compile(r"NR (\d+) ")
EXIT = re.compile(r"NR (\d+) = (-?\d+)")


def record(worker, server, seconds):
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        subprocess.run(
            ["perf", "record", "-q", "-o", data,
             "-e", "raw_syscalls:sys_enter", "-e", "raw_syscalls:sys_exit",
             "-e", "sched:sched_switch",
             "-p", f"{worker},{server}", "--", "sleep", str(seconds)],
            check=True, stdout=subprocess.DEVNULL)
        return subprocess.run(
            ["perf", "script", "-i", data, "-F", "comm,tid,cpu,time,event,trace"],
            check=True, capture_output=True, text=True).stdout


def parse(text):
    """Yields (time_s, comm, tid, kind, nr, value): kind 'enter', 'exit'
    (value: the return) or 'switch_in' (thread tid got a CPU)."""
    for line in text.splitlines():
        m = EVENT.match(line)
        if not m:
            continue
        rest, event = m.group("rest"), m.group("event")
        if event == "raw_syscalls:sys_enter":
            e = ENTER.search(rest)
            if not e:
                continue
            yield (float(m.group("time")), m.group("comm"), int(m.group("tid")), "enter",
                   int(e.group(1)), 0)
        elif event == "sched:sched_switch":
            n = re.search(r"next_pid=(\d+)", rest)
            if n:
                yield float(m.group("time")), "", int(n.group(1)), "switch_in", 0, 0
        elif event == "raw_syscalls:sys_exit":
            e = EXIT.search(rest)
            if e:
                yield (float(m.group("time")), m.group("comm"), int(m.group("tid")), "exit",
                       int(e.group(1)), int(e.group(2)))


def timeline(events, min_bytes):
    events = list(events)
    # Who sends the big frames: the caller (ps-worker) and the shard thread.
    senders = {}
    for t, comm, tid, kind, nr, value in events:
        if kind == "exit" and nr == SENDMSG and value >= min_bytes:
            senders.setdefault(comm, {}).setdefault(tid, 0)
            senders[comm][tid] += 1
    if "ps-worker" not in senders or "ps-server" not in senders:
        sys.exit("no frames of --min_bytes sent by both a ps-worker and a ps-server thread")
    caller = max(senders["ps-worker"], key=senders["ps-worker"].get)
    shard = max(senders["ps-server"], key=senders["ps-server"].get)
    readers = {}
    for t, comm, tid, kind, nr, value in events:
        if comm == "ps-worker" and tid != caller and kind == "exit" and nr == RECVFROM \
                and value >= min_bytes // 4:
            readers[tid] = readers.get(tid, 0) + 1
    if not readers:
        sys.exit("no ps-worker thread reads the answers")
    reader = max(readers, key=readers.get)

    # One step: caller sendmsg enter (compute done) -> its exit -> shard's
    # last read -> shard sendmsg enter (update done) -> its exit -> reader's
    # last read -> reader's next syscall (answer decoded; a futex wake when
    # the caller sleeps) -> caller back on a CPU -> caller's next sendmsg
    # enter.
    steps, cur = [], None
    last_shard_read = last_reader_read = None
    for t, comm, tid, kind, nr, value in events:
        if kind == "switch_in":
            if cur and "decoded" in cur and tid == caller and "resumed" not in cur:
                cur["resumed"] = t
            continue
        if tid == caller and nr == SENDMSG:
            if kind == "enter":
                if cur and "resumed" in cur:
                    cur["next_send"] = t
                    steps.append(cur)
                cur = {"send": t}
            elif cur and "send" in cur and "sent" not in cur:
                cur["sent"] = t
        elif cur is None:
            continue
        elif tid == shard and kind == "exit" and nr == RECVFROM and value > 0:
            last_shard_read = t
        elif tid == shard and nr == SENDMSG and kind == "enter" and "sent" in cur:
            cur["read"] = last_shard_read
            cur["update_done"] = t
        elif tid == shard and nr == SENDMSG and kind == "exit" and "update_done" in cur:
            cur["answer_sent"] = t
        elif tid == reader and kind == "exit" and nr == RECVFROM and value > 0:
            last_reader_read = t
        elif tid == reader and kind == "enter" and nr != RECVFROM and \
                "answer_sent" in cur and "decoded" not in cur:
            cur["landed"] = last_reader_read
            cur["decoded"] = t
        elif tid == caller and "decoded" in cur and "resumed" not in cur:
            cur["resumed"] = t  # it never left the CPU: its first syscall
    steps = [s for s in steps if all(k in s and s[k] is not None for k in (
        "send", "sent", "read", "update_done", "answer_sent", "landed", "decoded",
        "resumed", "next_send"))]
    return steps, (caller, shard, reader)


PHASES = [
    ("caller: sendmsg of the request (copy into the socket)", "send", "sent"),
    ("shard: request read (wake, header and body reads)", "sent", "read"),
    ("shard: update (checks, optimizer, answer encoded)", "read", "update_done"),
    ("shard: sendmsg of the answer", "update_done", "answer_sent"),
    ("reader: answer read (wake, reads)", "answer_sent", "landed"),
    ("reader: answer handled, caller woken (to its next syscall)", "landed", "decoded"),
    ("caller: back on a CPU (woken, or its turn after the reader)", "decoded", "resumed"),
    ("caller: next step (batch, params into the model, forward, backward, grads)",
     "resumed", "next_send"),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", type=int)
    parser.add_argument("--server", type=int)
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--script", help="a `perf script -F comm,tid,cpu,time,event,trace` text")
    parser.add_argument("--min_bytes", type=int, default=256 << 10,
                        help="a step's frames are at least this large")
    args = parser.parse_args()
    if args.script:
        with open(args.script) as f:
            text = f.read()
    elif args.worker and args.server:
        text = record(args.worker, args.server, args.seconds)
    else:
        parser.error("give --worker and --server, or --script")
    steps, (caller, shard, reader) = timeline(parse(text), args.min_bytes)
    if len(steps) < 5:
        sys.exit(f"only {len(steps)} whole steps traced: trace longer, or check the job "
                 "runs without overlap")
    print(f"# {len(steps)} steps traced; threads: caller {caller}, shard {shard}, "
          f"reader {reader}; medians in ms")
    total = statistics.median(s["next_send"] - s["send"] for s in steps)
    exchange = statistics.median(s["resumed"] - s["send"] for s in steps)
    for name, a, b in PHASES:
        print(f"{statistics.median(s[b] - s[a] for s in steps) * 1e3:8.3f}  {name}")
    print(f"{exchange * 1e3:8.3f}  exchange (caller's sendmsg to running again)")
    print(f"{total * 1e3:8.3f}  step (sendmsg to sendmsg)")


if __name__ == "__main__":
    main()
