#!/usr/bin/env python3
"""`loom train --hosts` across two "hosts" (network namespaces; scripts/netns_two_hosts.sh):
the supervisor's checks reach the rank on the other host (Note [Status over TCP]).

usage: check_hosts.py LOOM

  trains:      --hosts 10.77.0.1:1,10.77.0.2:1 --dp 2 trains to the end and exits 0;
  hung:        the remote rank blocks for good in step 4 (LOOM_FAILPOINT=hang@3:1, comm.hang_s 3):
               its heartbeat comes over TCP, the job ends within 30 s naming it and its host;
  killed:      the remote rank dies in the save of step 4 (shard@4:1): the job fails naming it
               and its host, step 2's checkpoint is intact, and --resume auto finishes the run;
  signals:     the supervisor gets SIGTERM: no rank outlives it by more than 5 s;
  elastic:     --elastic 1:2, the remote rank SIGKILLed after a checkpoint, and the local one a
               second later, before its own diagnosis, unless Open MPI's abort ended it first
               (either way a survivor): the job re-forms on the one host left with no command (dp 2 -> 1,
               grad_accum 1 -> 2), loses at most
               save_every steps, and its final weights equal, bit for bit, a run resumed by hand
               from the same step on that layout;
  below-min:   --elastic 2:2 loses a host: it stops (fewer than MIN), and --resume auto goes on;
  both:        --elastic 1:2, the remote rank SIGKILLed and the local one at once after it (seen
               gone in one poll, or under load the local one first and the remote one within
               0.4 s): the local host is kept and the job re-forms on it.
A stopped remote host (its beats stop) is check_elastic_hosts.py's `hung` (label slow). Exits 77
(ctest SKIP) where network namespaces cannot be made.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from hosts_harness import by_hand_equal, expect, fail, require_netns, resumed_steps  # noqa: E402
from soak import newest_step, rank_pid  # noqa: E402  (hosts_harness put scripts/ on the path)

NETNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "netns_two_hosts.sh")
HOSTS = "10.77.0.1:1,10.77.0.2:1"


def cmd(loom, ckpt, steps, *extra):
    return [NETNS, "exec", "--", loom, "train", "--hosts", HOSTS, "--dp", "2", "--set", "train.batch=8",
            "train.seq=64", f"train.steps={steps}", "model.layers=2", "train.val_every=0", "train.val_batches=1",
            "train.threads=1", f"checkpoint.dir={ckpt}", "comm.timeout_s=5", "--save-every", "2", *extra]


def run(loom, ckpt, steps, *extra, env=None, limit=120):
    t0 = time.time()
    p = subprocess.run(cmd(loom, ckpt, steps, *extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=env, timeout=limit)
    return p.returncode, p.stdout, time.time() - t0


def with_env(**kv):
    env = dict(os.environ)
    env.update(kv)
    return env


def kill_remote_after_a_save(proc, ckpt, then_local=False):
    deadline = time.time() + 60
    while newest_step(ckpt) < 6 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    pids = [rank_pid(r, ckpt) for r in ((1, 0) if then_local else (1,))]
    if None in pids:
        fail("a rank's process was not found", proc.communicate()[0])
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return newest_step(ckpt)


def elastic(loom, work):
    steps = 40
    ckpt = os.path.join(work, "elastic")
    keep = ("--set", "checkpoint.keep_last=0", "train.log_every=1")
    proc = subprocess.Popen(cmd(loom, ckpt, steps, "--elastic", "1:2", *keep),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed_after = kill_remote_after_a_save(proc, ckpt)
    # The survivor gone without an exit code after the failure was seen is not the one that failed.
    time.sleep(1.0)  # (its own diagnosis takes comm.timeout_s / 2 = 2.5 s)
    local = rank_pid(0, ckpt)
    if local is not None:
        os.kill(local, signal.SIGKILL)
    else:  # Open MPI's abort ended it already, at times before the peer's loss was seen: the same case
        print("elastic: the local rank had already ended (Open MPI's abort)")
    killed_at, first_new_step, lines = time.time(), None, []
    for line in proc.stdout:  # the time from the kill to the re-formed job's first step (printed)
        lines.append(line)
        if first_new_step is None and line.startswith("step ") and any(l.startswith("resumed from") for l in lines):
            first_new_step = time.time() - killed_at
    proc.wait(timeout=180)
    out = "".join(lines)
    expect(first_new_step is not None, f"no step after a resume line (the elastic job exited {proc.returncode})", out)
    print(f"elastic: from the SIGKILL to the re-formed job's first step: {first_new_step:.2f} s")
    expect(proc.returncode == 0 and f"step {steps}/{steps}" in out, f"the elastic job exited {proc.returncode}", out)
    expect("lost 10.77.0.2; going on with 1 host (10.77.0.1:1): dp 1, grad_accum 2, micro-batch 4" in out,
           "the re-forming was not said", out)
    at = resumed_steps(out)
    expect(len(at) == 1, "no single resume line", out)
    step = at[0]
    expect(killed_after <= step and step % 2 == 0, f"resumed from step {step}, killed after step {killed_after}", out)
    # By hand: the same step's checkpoint, resumed on the re-formed layout in one process.
    by_hand = os.path.join(work, "by-hand")
    by_hand_equal(ckpt, by_hand, step, steps, 1,
                  [loom, "train", "--resume", "auto", "--save-every", "2", "--set", "train.batch=8", "train.seq=64",
                   f"train.steps={steps}", "model.layers=2", "train.val_every=0", "train.val_batches=1",
                   "train.threads=1", f"checkpoint.dir={by_hand}", "checkpoint.keep_last=0", "parallel.dp=1",
                   "train.grad_accum=2", "parallel.micro_batch=4"], out)

    ckpt = os.path.join(work, "below-min")
    proc = subprocess.Popen(cmd(loom, ckpt, steps, "--elastic", "2:2"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    kill_remote_after_a_save(proc, ckpt)
    out = proc.communicate(timeout=120)[0]
    expect(proc.returncode != 0 and "1 host (10.77.0.1:1) left, fewer than MIN 2: stopping" in out,
           f"below MIN: rc {proc.returncode}", out)
    rc, out, _ = run(loom, ckpt, steps, "--resume", "auto")
    expect(rc == 0 and f"step {steps}/{steps}" in out, f"the resume after a stop below MIN exited {rc}", out)

    # The remote rank SIGKILLed and the local one at once after it, as Open MPI's abort can end
    # it: the local one is the survivor (Note [Survivors] in core/survivors.h), its host the
    # supervisor's, and the job re-forms there.
    ckpt = os.path.join(work, "both")
    proc = subprocess.Popen(cmd(loom, ckpt, 12, "--elastic", "1:2"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    kill_remote_after_a_save(proc, ckpt, then_local=True)
    out = proc.communicate(timeout=180)[0]
    expect(proc.returncode == 0 and "lost 10.77.0.2; going on with 1 host (10.77.0.1:1)" in out and "step 12/12" in out,
           f"both ranks killed: rc {proc.returncode}", out)


def main():
    loom = os.path.abspath(sys.argv[1])
    require_netns()
    subprocess.run([NETNS, "up"], check=True)
    work = tempfile.mkdtemp(prefix="loom-hosts-")
    try:
        ckpt = os.path.join(work, "trains")
        rc, out, _ = run(loom, ckpt, 6)
        expect(rc == 0 and "done: final val_loss" in out, f"a two-host run exited {rc}", out)

        ckpt = os.path.join(work, "hung")
        rc, out, secs = run(loom, ckpt, 40, "--set", "comm.hang_s=3", env=with_env(LOOM_FAILPOINT="hang@3:1"))
        expect(rc != 0 and "rank 1 on host 10.77.0.2: hung in step 4" in out and secs < 30,
               f"hung remote rank: rc {rc} after {secs:.1f} s", out)

        ckpt = os.path.join(work, "killed")
        rc, out, _ = run(loom, ckpt, 8, env=with_env(LOOM_FAILPOINT="shard@4:1"))
        expect(rc != 0 and "rank 1 on host 10.77.0.2: left no exit code" in out, f"killed remote rank: rc {rc}", out)
        expect(newest_step(ckpt) == 2, f"step {newest_step(ckpt)}, not 2, is the newest", out)
        rc, out, _ = run(loom, ckpt, 8, "--resume", "auto")
        expect(rc == 0 and "step 8/8" in out, f"resume across the hosts exited {rc}", out)

        ckpt = os.path.join(work, "signals")
        proc = subprocess.Popen(cmd(loom, ckpt, 100000), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(ckpt, "latest")) and time.time() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # the netns wrapper execs: this is the supervisor
        out = proc.communicate(timeout=30)[0]
        t0 = time.time()
        while time.time() - t0 < 5 and (rank_pid(0, ckpt) or rank_pid(1, ckpt)):
            time.sleep(0.1)
        expect(rank_pid(0, ckpt) is None and rank_pid(1, ckpt) is None, "a rank outlived its supervisor by 5 s", out)
        elastic(loom, work)
        print("ok: trains, hung, killed + resume, signals, elastic, below-min, both across two hosts")
    finally:
        subprocess.run([NETNS, "down"])
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
