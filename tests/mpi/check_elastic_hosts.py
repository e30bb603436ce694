#!/usr/bin/env python3
"""`loom train --hosts ... --elastic` on four "hosts" (network namespaces, HOSTS=4
scripts/netns_hosts.sh), one rank each, dp 4 (Note [Elastic launch]).

usage: check_elastic_hosts.py LOOM

  twice:       --elastic 2:4; every process of host d is SIGKILLed (the host lost), then, once the
               re-formed job has saved, host b's: it re-forms twice with no command (dp 4 -> 2 on
               a, b; then on a, c) and its final weights equal, bit for bit, a run resumed by hand
               from the second re-forming's step on its layout and hosts;
  in-recovery: host d is lost, and host b while the job re-forms on a and b (its rank started,
               before its first step): it re-forms again (on a and c) and finishes;
  hung:        every process of host d is SIGSTOPped (comm.timeout_s 300): its beats stop, the
               supervisor ends the job as frozen and it re-forms without d;
  all-lost:    --elastic 1:4; every rank is killed: the job stops cleanly (no host left), and
               --resume auto on the four hosts finishes it;
  memory:      in-memory checkpoints every 2 steps (disk every 100): host d lost with its memory;
               the job resumes from the peers' copies (at most 2 steps lost) and equals a by-hand
               resume from the uninterrupted job's disk checkpoint of that step;
  replan:      tp 4: host d lost leaves no replica; the split is re-planned to tp 2 on a and b,
               equal to a by-hand resume on that layout;
  fits:        dp 4 x ZeRO-1 under a memory.limit_gib between what a dp 2 rank needs at ZeRO-1 and
               at ZeRO-2: host d lost, the supervisor's memory check turns dp 2 at ZeRO-1 down and
               re-plans to ZeRO-2, equal to a by-hand resume on that layout;
  grows:       --elastic 2:4 with comm.rejoin_s 3: host d is lost (re-formed on a and b), answers
               again, and the job stops after its next checkpoint and grows back onto the four
               hosts (dp 4) with no step lost; its final weights equal, bit for bit, a run resumed
               by hand from that checkpoint on the four hosts.
Prints the seconds from each loss to the re-formed job's first step. Exits 77 (ctest SKIP)
where network namespaces cannot be made.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from hosts_harness import NETNS, by_hand_equal, fail, require_netns, resumed_steps  # noqa: E402
from soak import newest_step, rank_pid  # noqa: E402  (hosts_harness put scripts/ on the path)

ALL = "10.77.0.1:1,10.77.0.2:1,10.77.0.3:1,10.77.0.4:1"
STEPS = 300  # long enough (~10 s) for a second loss after a re-forming


def args(loom, ckpt, *extra, hosts=ALL, dp=4, save_every=2):
    return [loom, "train", "--hosts", hosts, "--dp", str(dp), "--save-every", str(save_every), "--set", "train.batch=8",
            "train.seq=64", f"train.steps={STEPS}", "model.layers=2", "train.val_every=0", "train.val_batches=1",
            "train.threads=1", f"checkpoint.dir={ckpt}", "checkpoint.keep_last=0", "train.log_every=1",
            "comm.timeout_s=5", *extra]


class Job:
    """A job under the namespace harness whose output is read as it comes, with times."""

    def __init__(self, loom, ckpt, *extra, save_every=2, dp=4):
        self.proc = subprocess.Popen([NETNS, "exec", "--", *args(loom, ckpt, *extra, save_every=save_every, dp=dp)],
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines = []  # (time, line)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.time(), line))

    def wait_for(self, text, after=0.0, limit=90):
        deadline = time.time() + limit
        while time.time() < deadline:
            for t, line in list(self.lines):
                if t >= after and text in line:
                    return t
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.02)
        fail(f"no line with {text!r}", self.out())

    def finish(self, limit=240):
        try:
            self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail(f"the job did not end within {limit} s", self.out())
        self.reader.join(timeout=10)
        return self.proc.returncode, self.out()

    def out(self):
        return "".join(line for _, line in self.lines)


def lose(host, sig="KILL"):
    subprocess.run([NETNS, "kill", host, sig], check=True, capture_output=True)
    return time.time()


def wait_for_save(ckpt, step, limit=60):
    deadline = time.time() + limit
    while newest_step(ckpt) < step and time.time() < deadline:
        time.sleep(0.02)
    if newest_step(ckpt) < step:
        fail(f"no checkpoint of step {step} within {limit} s")


def first_step_after(job, t):
    return job.wait_for("step ", after=job.wait_for("resumed from", after=t)) - t


def twice(loom, work):
    ckpt = os.path.join(work, "twice")
    job = Job(loom, ckpt, "--elastic", "2:4")
    wait_for_save(ckpt, 6)
    t = lose("loom-d")
    print(f"twice: host d lost; first step of the re-formed job {first_step_after(job, t):.2f} s later")
    job.wait_for("resumed from", after=t)
    wait_for_save(ckpt, resumed_steps(job.out())[-1] + 2)  # a checkpoint of the re-formed job
    t = lose("loom-b")
    print(f"twice: host b lost; first step of the re-formed job {first_step_after(job, t):.2f} s later")
    rc, out = job.finish()
    if rc != 0 or f"step {STEPS}/{STEPS}" not in out:
        fail(f"the job that lost two hosts exited {rc}", out)
    for said in ("lost 10.77.0.4; going on with 2 hosts (10.77.0.1:1,10.77.0.2:1): dp 2, grad_accum 2",
                 "lost 10.77.0.2; going on with 2 hosts (10.77.0.1:1,10.77.0.3:1): dp 2, grad_accum 2"):
        if said not in out:
            fail(f"not said: {said}", out)
    step = resumed_steps(out)[-1]
    by_hand = os.path.join(work, "by-hand")
    by_hand_equal(ckpt, by_hand, step, STEPS, 2,
                  [NETNS, "exec", "--", *args(loom, by_hand, "--resume", "auto", "--grad-accum", "2",
                                               hosts="10.77.0.1:1,10.77.0.3:1", dp=2)], out)


def in_recovery(loom, work):
    ckpt = os.path.join(work, "in-recovery")
    job = Job(loom, ckpt, "--elastic", "2:4")
    wait_for_save(ckpt, 6)
    old = rank_pid(1, ckpt)
    t = lose("loom-d")
    job.wait_for("re-forming 1", after=t)
    deadline = time.time() + 30  # the re-formed job's rank 1 (on host b) has started
    while rank_pid(1, ckpt) in (None, old) and time.time() < deadline:
        time.sleep(0.01)
    lose("loom-b")  # while the re-formed job starts: before its first step
    rc, out = job.finish()
    if rc != 0 or "re-forming 2" not in out or f"step {STEPS}/{STEPS}" not in out:
        fail(f"a loss during the re-forming: rc {rc}", out)


def hung(loom, work):
    ckpt = os.path.join(work, "hung")
    job = Job(loom, ckpt, "--elastic", "2:4", "--set", "comm.timeout_s=300")
    wait_for_save(ckpt, 6)
    t = lose("loom-d", "STOP")
    print(f"hung: host d stopped; first step of the re-formed job {first_step_after(job, t):.2f} s later")
    rc, out = job.finish()
    if rc != 0 or "no heartbeat" not in out or "lost 10.77.0.4" not in out:
        fail(f"a stopped host: rc {rc}", out)
    lose("loom-d", "CONT")
    lose("loom-d")  # what the stop left there


def all_lost(loom, work):
    ckpt = os.path.join(work, "all-lost")
    job = Job(loom, ckpt, "--elastic", "1:4")
    wait_for_save(ckpt, 6)
    os.kill(rank_pid(0, ckpt), signal.SIGKILL)  # host a's rank (the supervisor lives on host a too)
    # First, well apart: a rank of the supervisor's host seen gone up to 0.4 s before another
    # host's is that failure's survivor (Note [Survivors] in core/survivors.h).
    time.sleep(1.5)
    for host in ("loom-b", "loom-c", "loom-d"):
        lose(host)
    rc, out = job.finish()
    if rc == 0 or "0 hosts () left" not in out:
        fail(f"every host lost: rc {rc}", out)
    r = subprocess.run([NETNS, "exec", "--", *args(loom, ckpt, "--resume", "auto")], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0 or f"step {STEPS}/{STEPS}" not in r.stdout:
        fail("the resume after every host was lost failed", r.stdout)


def grows(loom, work):
    ckpt = os.path.join(work, "grows")
    # Long enough that the re-formed dp 2 job (about 90 steps a second on two cores) is still
    # running when host d answers again (comm.rejoin_s, then a probe: 4-6 s after the loss).
    steps = 1200  # saving every 20 (60 checkpoints of 5 MB kept, for the by-hand resume)
    job = Job(loom, ckpt, "--elastic", "2:4", "--set", "comm.rejoin_s=3", f"train.steps={steps}", save_every=20)
    wait_for_save(ckpt, 6)
    lose("loom-d")
    rc, out = job.finish()
    if rc != 0 or f"step {steps}/{steps}" not in out:
        fail(f"the job that lost and regained a host exited {rc}", out)
    said = "(re-forming 2): grew onto 10.77.0.4; going on with 4 hosts (10.77.0.1:1,10.77.0.2:1,10.77.0.3:1,10.77.0.4:1)" \
           ": dp 4, grad_accum 1"
    if said not in out:
        fail(f"not said: {said}", out)
    stopped = [int(l.split("stopped after saving step ")[1].split(",")[0]) for l in out.splitlines()
               if "stopped after saving step " in l]
    step = resumed_steps(out)[-1]
    if stopped != [step]:
        fail(f"stopped after {stopped}, resumed from {step}: a step lost or repeated", out)
    by_hand = os.path.join(work, "grows-by-hand")
    by_hand_equal(ckpt, by_hand, step, steps, 4,
                  [NETNS, "exec", "--", *args(loom, by_hand, "--resume", "auto", "--set", f"train.steps={steps}",
                                                    save_every=20)], out)
    print(f"grows: stopped after step {stopped[0]} and resumed there on four hosts")


def memory_stores(ckpt):
    """The in-memory stores of the job writing `ckpt` (Note [In-memory checkpoints]), by host."""
    out = {}
    for name in os.listdir("/dev/shm"):
        marker = os.path.join("/dev/shm", name, "loom-memory")
        if name.startswith("loom-memory-") and os.path.isfile(marker):
            with open(marker) as f:
                if f.read().split(" ", 1)[1].strip() == os.path.abspath(ckpt):
                    out[name[len("loom-memory-") + 17:]] = os.path.join("/dev/shm", name)  # after the 16-hex hash
    return out


def memory(loom, work):
    """Disk checkpoints every 100 steps, in-memory ones every 2: host d is lost with its memory
    (its store removed as it is killed); the job re-forms from the peers' copies, losing at most
    2 steps and reading no disk checkpoint, and equals a by-hand resume from that step."""
    ckpt = os.path.join(work, "memory")
    job = Job(loom, ckpt, "--elastic", "2:4", "--set", "checkpoint.memory_every=2", save_every=100)
    job.wait_for(f"step 20/{STEPS}")
    stores = memory_stores(ckpt)
    if sorted(stores) != ["loom-a", "loom-b", "loom-c", "loom-d"]:
        fail(f"the stores are {sorted(stores)}, not one a host", job.out())
    t = lose("loom-d")
    shutil.rmtree(stores["loom-d"])
    seen = [int(line.split("step ")[1].split("/")[0]) for when, line in list(job.lines)
            if when <= t and line.startswith("step ")]
    print(f"memory: host d lost after step {seen[-1]}; first step of the re-formed job {first_step_after(job, t):.2f} s "
          "later")
    rc, out = job.finish()
    if rc != 0 or f"step {STEPS}/{STEPS}" not in out:
        fail(f"the job that lost a host with its memory exited {rc}", out)
    resumed = [l for l in out.splitlines() if l.startswith("resumed from the in-memory checkpoint of step ")]
    step = resumed_steps(out)[-1]
    if len(resumed) != 1 or step < seen[-1] - 2 or step >= 100:
        fail(f"resumed at step {step} after step {seen[-1]} was seen: more than memory_every = 2 lost, or not from "
             "memory", out)
    if memory_stores(ckpt):
        fail(f"stores left after the job ended: {memory_stores(ckpt)}", out)
    # By hand: the uninterrupted job's disk checkpoint of that step, resumed on a and b, ends
    # with the job's final weights.
    reference = os.path.join(work, "memory-reference")
    r = subprocess.run([NETNS, "exec", "--", *args(loom, reference)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if r.returncode != 0:
        fail("the uninterrupted reference failed", r.stdout)
    by_hand = os.path.join(work, "memory-by-hand")
    by_hand_equal(reference, by_hand, step, STEPS, 2,
                  [NETNS, "exec", "--", *args(loom, by_hand, "--resume", "auto", "--grad-accum", "2",
                                               hosts="10.77.0.1:1,10.77.0.2:1", dp=2)], out, against=ckpt)
    for line in out.splitlines():
        if "re-forming" in line or "in-memory" in line:
            print("memory:", line)


def re_planned(loom, name, job, ckpt, work, steps, said, by_hand_flags, dp, note=""):
    """Host d lost from `job`: it must re-form on a and b saying `said` and finish `steps`, its
    final weights bit for bit a by-hand resume from the same step with `by_hand_flags` at dp."""
    t = lose("loom-d")
    print(f"{name}: host d lost{note}; first step of the re-formed job {first_step_after(job, t):.2f} s later")
    rc, out = job.finish()
    if rc != 0 or f"step {steps}/{steps}" not in out or said not in out:
        fail(f"the re-planned job exited {rc} (or did not say: {said})", out)
    step = resumed_steps(out)[-1]
    by_hand = os.path.join(work, f"{name}-by-hand")
    by_hand_equal(ckpt, by_hand, step, steps, 2,
                  [NETNS, "exec", "--", *args(loom, by_hand, "--resume", "auto", *by_hand_flags,
                                               hosts="10.77.0.1:1,10.77.0.2:1", dp=dp)], out)


def replan(loom, work):
    """tp 4 on the four hosts: host d lost leaves 3 slots, no replica of tp 4; the split is
    re-planned to tp 2 on a and b (Note [Elastic shapes]) and the job equals a by-hand resume
    on that layout."""
    ckpt = os.path.join(work, "replan")
    job = Job(loom, ckpt, "--elastic", "2:4", "--tp", "4", "--sp", dp=1)
    wait_for_save(ckpt, 6)
    re_planned(loom, "replan", job, ckpt, work, STEPS,
               "going on with 2 hosts (10.77.0.1:1,10.77.0.2:1): re-planned to tp 2 pp 1 cp 1, dp 1, grad_accum 1",
               ["--tp", "2", "--sp"], dp=1)


def rank_need_mib(loom, zero, model):
    """Rank 0's estimate at dp 2 (micro-batch 2, grad_accum 2) and ZeRO `zero`, read from the
    refusal under a budget nothing fits (Note [Memory budget])."""
    r = subprocess.run([loom, "train", "--nproc", "2", "--dp", "2", "--zero", str(zero), "--micro-batch", "2",
                        "--grad-accum", "2", "--set", "train.batch=8", "train.seq=64", "train.steps=1", "model.layers=2",
                        "train.val_every=0", "train.threads=1", "checkpoint.dir=", "memory.limit_gib=0.0001", *model],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    got = re.search(r"activations at micro-batch 2 x seq 64 \d+ MiB = (\d+) MiB", r.stdout)
    if r.returncode == 0 or not got:
        fail(f"no refusal with an estimate at ZeRO-{zero}", r.stdout)
    return int(got.group(1))


def fits(loom, work):
    """dp 4 x ZeRO-1 under a budget that holds a dp 2 rank at ZeRO-2 but not at ZeRO-1: host d
    lost, the supervisor re-plans to ZeRO-2 (Note [Elastic shapes]: the first shape whose ranks
    fit memory) and the job equals a by-hand resume on that layout."""
    model = ["model.layers=4", "model.d_model=512", "model.heads=8", "parallel.bucket_mb=1"]  # 1 MiB buckets
    z1, z2 = rank_need_mib(loom, 1, model), rank_need_mib(loom, 2, model)
    if z1 - z2 < 4:
        fail(f"ZeRO-2 at dp 2 should need a few MiB less than ZeRO-1: {z2} against {z1} MiB")
    steps = 40  # a larger model than the other cases': fewer steps
    budget = [f"memory.limit_gib={(z1 + z2) / 2 / 1024:.6f}", f"train.steps={steps}", *model]
    ckpt = os.path.join(work, "fits")
    job = Job(loom, ckpt, "--elastic", "2:4", "--zero", "1", "--set", *budget)
    wait_for_save(ckpt, 6)
    re_planned(loom, "fits", job, ckpt, work, steps,
               "going on with 2 hosts (10.77.0.1:1,10.77.0.2:1): re-planned to tp 1 pp 1 cp 1 zero 2, dp 2, grad_accum 2",
               ["--zero", "2", "--grad-accum", "2", "--set", *budget], dp=2,
               note=f" (dp 2 needs {z1} MiB a rank at ZeRO-1, {z2} at ZeRO-2, budget {(z1 + z2) / 2} MiB)")


def main():
    loom = os.path.abspath(sys.argv[1])
    require_netns()
    work = tempfile.mkdtemp(prefix="loom-elastic-")
    try:
        for case in (fits, memory, replan, twice, in_recovery, hung, all_lost, grows):
            subprocess.run([NETNS, "up"], check=True, env=dict(os.environ, HOSTS="4"), capture_output=True)
            case(loom, work)
        print("ok: fits, memory, replan, twice, in-recovery, hung, all-lost, grows on four hosts")
    finally:
        subprocess.run([NETNS, "down"])
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
