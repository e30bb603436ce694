#!/usr/bin/env python3
"""Kills loom ranks for real (SIGKILL under mpirun) and checks that nothing is lost.

usage: check_kill.py LOOM mid-step | during-save | offload | offload-zero3 | ps-server | ps-worker

mid-step:    a dp3 run is SIGKILLed on rank 1 while it trains; the survivors must exit
             within comm.timeout_s naming rank 1 and the collective they were in; then
             `--resume auto` finishes the run and its final checkpoint is byte-identical
             to the uninterrupted run's.
offload:     mid-step with the AdamW moments and the parameters offloaded (Notes [Optimizer
             offload], [Parameter offload]) in the killed run and its resume, against the
             in-memory reference: the final checkpoint is byte-identical, and the killed
             ranks' scratch files are gone.
offload-zero3: the same with ZeRO-3 (each rank's own pieces in its file, Note [ZeRO-3
             offload]), against an uninterrupted run of the same layout (its rank files
             hold the packed own pieces).
during-save: the writer is killed inside a save at each failpoint (Note [Failpoints]:
             rank 1 half way through its shard; rank 0 after the manifest; rank 0 after
             the rename, before `latest`); the previous checkpoint must still verify,
             hold exactly the uninterrupted run's bytes, and resume to the same end.
ps-server, ps-worker: a parameter-server job (2 workers, 1 server: Note [Parameter server])
             loses its server (rank 2, ps.mode sync) or a worker (rank 1, ps.mode async: the
             server has a receive open per worker); the survivors must exit within
             comm.timeout_s naming the dead rank.
"""
import os
import re
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from soak import rank_pid  # noqa: E402  (the soak script's process finder)

TIMEOUT_S = 10
STEPS = 60
EVERY = 10


def args(loom, ckpt, extra=()):
    return [loom, "train", "--nproc", "3", "--dp", "3", "--set", "train.batch=12", "train.seq=128",
            f"train.steps={STEPS}", "model.layers=2", "train.val_every=0", "train.val_batches=1",
            "train.threads=1", f"checkpoint.dir={ckpt}", "checkpoint.keep_last=0",
            f"comm.timeout_s={TIMEOUT_S}", *extra]


def run(cmd, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    return p.returncode, p.stdout


def fail(msg, out=""):
    print(out)
    print("FAIL:", msg)
    sys.exit(1)


def same_files(a, b, step):
    for r in range(3):
        name = f"step-{step:08d}/rank-{r:05d}.bin"
        with open(os.path.join(a, name), "rb") as x, open(os.path.join(b, name), "rb") as y:
            if x.read() != y.read():
                return f"{name} differs"
    return None


def resume_and_compare(loom, ckpt, ref, expect_from, extra=()):
    rc, out = run(args(loom, ckpt, ["--resume", "auto", "--save-every", str(EVERY), *extra]))
    if rc != 0:
        fail(f"--resume auto exited {rc}", out)
    if f"resumed from {ckpt}/step-{expect_from:08d}" not in out:
        fail(f"--resume auto did not continue from step {expect_from}", out)
    diff = same_files(ckpt, ref, STEPS)
    if diff:
        fail(f"after the resume the final checkpoint is not the uninterrupted run's: {diff}")


def mid_step(loom, tmp, ref, extra=()):
    ckpt = os.path.join(tmp, "killed")
    proc = subprocess.Popen(args(loom, ckpt, ["--save-every", str(EVERY), *extra]), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(ckpt, "latest")):  # a step is saved: training runs
        if proc.poll() is not None or time.time() > deadline:
            fail("the run ended before its first checkpoint", proc.communicate()[0])
        time.sleep(0.02)
    time.sleep(random.uniform(0.1, 0.6))
    pid = rank_pid(1, ckpt)
    if pid is None:
        fail("rank 1's process was not found", proc.communicate()[0])
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    out = proc.communicate(timeout=TIMEOUT_S * 4)[0]
    took = time.time() - killed
    print(out)
    print(f"rank 1 (pid {pid}) SIGKILLed; the job exited {proc.returncode} {took:.2f} s later "
          f"(comm.timeout_s = {TIMEOUT_S})")
    if proc.returncode == 0:
        fail("the job exited 0 after a rank was killed")
    if took >= TIMEOUT_S:
        fail(f"the survivors took {took:.1f} s, more than comm.timeout_s")
    for want in ["rank 1: left no exit code", "failed at global rank 0", "failed at global rank 2"]:
        if want not in out:
            fail(f"output lacks: {want}")
    if not re.search(r"rank [0-9, ]*\b1\b[0-9, ]* died", out) and "rank 1 (group rank 1): no answer" not in out:
        fail("no survivor names rank 1 as dead or missing")
    if " #" not in out or "on group" not in out:
        fail("no survivor names the pending collective")
    with open(os.path.join(ckpt, "latest")) as f:
        newest = int(f.read().strip().split("-")[1])
    resume_and_compare(loom, ckpt, ref, newest, extra)


def offload_args(tmp, zero):
    scratch = os.path.join(tmp, "scratch")
    os.makedirs(scratch, exist_ok=True)
    return ["--set", "offload.optimizer=disk", "offload.params=disk", f"offload.dir={scratch}",
            "offload.sub_group_mb=0.05", f"parallel.zero={zero}"]


def offload(loom, tmp, ref, zero=0):
    mid_step(loom, tmp, ref, offload_args(tmp, zero))
    scratch = os.path.join(tmp, "scratch")
    if os.listdir(scratch):
        fail(f"offload scratch files outlived their processes: {os.listdir(scratch)}")


def during_save(loom, tmp, ref):
    for point, rank in [("shard", 1), ("manifest", 0), ("latest", 0)]:
        ckpt = os.path.join(tmp, "save-" + point)
        env = dict(os.environ, LOOM_FAILPOINT=f"{point}@{2 * EVERY}:{rank}")
        rc, out = run(args(loom, ckpt, ["--save-every", str(EVERY)]), env=env)
        if rc == 0 or "LOOM_FAILPOINT" not in out:
            fail(f"failpoint {point}: the job did not die in the save of step {2 * EVERY} (exit {rc})", out)
        rc, verify = run([loom, "ckpt", "inspect", "--verify", ckpt])
        if rc != 0 or f"step-{EVERY:08d}" not in verify.splitlines()[0] or "every CRC-32 matches" not in verify:
            fail(f"failpoint {point}: the previous checkpoint does not verify", verify)
        diff = same_files(ckpt, ref, EVERY)
        if diff:
            fail(f"failpoint {point}: the previous checkpoint is not the uninterrupted run's: {diff}")
        print(f"failpoint {point} (rank {rank} killed in the save of step {2 * EVERY}): step {EVERY} verifies "
              "and matches")
        # Killed after the rename, step 2*EVERY is complete though `latest` still names
        # step EVERY: --resume auto takes the newest complete step (Note [Resume auto]).
        resume_and_compare(loom, ckpt, ref, 2 * EVERY if point == "latest" else EVERY)


def ps_kill(loom, tmp, victim, mode):
    marker = os.path.join(tmp, "ps")  # names the job's processes; nothing is saved there
    cmd = [loom, "train", "--nproc", "3", "--dp", "2", "--set", "parallel.ps_servers=1", f"ps.mode={mode}", "train.batch=8",
           "train.seq=64", "train.steps=100000", "model.layers=2", "train.val_every=0", "train.val_batches=1",
           "train.threads=1", f"checkpoint.dir={marker}", "train.log_every=1", f"comm.timeout_s={TIMEOUT_S}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while True:  # training runs once the workers log a step
        line = proc.stdout.readline()
        if not line or time.time() > deadline:
            fail("the run ended or stalled before its first step", line + proc.communicate()[0])
        if re.match(r"step \d+/", line):
            break
    time.sleep(random.uniform(0.2, 0.8))
    pid = rank_pid(victim, marker)
    if pid is None:
        fail(f"rank {victim}'s process was not found", proc.communicate()[0])
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    out = proc.communicate(timeout=TIMEOUT_S * 4)[0]
    took = time.time() - killed
    print(out[-4000:])
    print(f"rank {victim} (pid {pid}) SIGKILLed; the job exited {proc.returncode} {took:.2f} s later "
          f"(comm.timeout_s = {TIMEOUT_S})")
    if proc.returncode == 0:
        fail("the job exited 0 after a rank was killed")
    if took >= TIMEOUT_S:
        fail(f"the survivors took {took:.1f} s, more than comm.timeout_s")
    if f"rank {victim}: left no exit code" not in out:
        fail(f"output lacks: rank {victim}: left no exit code")
    if not re.search(rf"rank [0-9, ]*\b{victim}\b[0-9, ]* died", out) and f"rank {victim} (group rank" not in out:
        fail(f"no survivor names rank {victim} as dead or missing")


def main():
    loom, mode = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="loom-kill-")
    if mode.startswith("ps-"):
        try:
            ps_kill(loom, tmp, *((2, "sync") if mode == "ps-server" else (1, "async")))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print("PASS")
        return
    try:
        ref = os.path.join(tmp, "reference")
        zero3 = mode == "offload-zero3"
        rc, out = run(args(loom, ref, ["--save-every", str(EVERY), *(offload_args(tmp, 3) if zero3 else [])]))
        if rc != 0:
            fail(f"the uninterrupted run exited {rc}", out)
        {"mid-step": mid_step, "during-save": during_save, "offload": offload,
         "offload-zero3": lambda loom, tmp, ref: offload(loom, tmp, ref, 3)}[mode](loom, tmp, ref)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
