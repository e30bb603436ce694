#!/usr/bin/env python3
"""`loom train --hosts` across two "hosts" (network namespaces; scripts/netns_two_hosts.sh):
the supervisor's checks reach the rank on the other host (Note [Status over TCP]).

usage: check_hosts.py LOOM

  trains:      --hosts 10.77.0.1:1,10.77.0.2:1 --dp 2 trains to the end and exits 0;
  hung:        the remote rank blocks for good in step 4 (LOOM_FAILPOINT=hang@3:1, comm.hang_s 3):
               its heartbeat comes over TCP, the job ends within 30 s naming it and its host;
  killed:      the remote rank dies in the save of step 4 (shard@4:1): the job fails naming it
               and its host, step 2's checkpoint is intact, and --resume auto finishes the run;
  frozen:      the remote rank is SIGSTOPped with comm.timeout_s 300: its beats stop and the
               job ends within 40 s, naming it as frozen (its pid is not the supervisor's to
               see), and the stopped process does not outlive the job;
  signals:     the supervisor gets SIGTERM: no rank outlives it by more than 5 s;
  elastic:     --elastic 1:2, the remote rank SIGKILLed after a checkpoint: the job re-forms on
               the one host left with no command (dp 2 -> 1, grad_accum 1 -> 2), loses at most
               save_every steps, and its final weights equal, bit for bit, a run resumed by hand
               from the same step on that layout;
  below-min:   --elastic 2:2 loses a host: it stops (fewer than MIN), and --resume auto goes on.
Exits 77 (ctest SKIP) where network namespaces cannot be made.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "scripts"))
from soak import final_files, newest_step, rank_pid  # noqa: E402

NETNS = os.path.join(here, "..", "..", "scripts", "netns_two_hosts.sh")
HOSTS = "10.77.0.1:1,10.77.0.2:1"


def fail(msg, out=""):
    print(out)
    print("FAIL:", msg)
    sys.exit(1)


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


def expect(cond, msg, out):
    if not cond:
        fail(msg, out)


def kill_remote_after_a_save(proc, ckpt):
    deadline = time.time() + 60
    while newest_step(ckpt) < 6 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    pid = rank_pid(1, ckpt)
    if pid is None:
        fail("the remote rank's process was not found", proc.communicate()[0])
    os.kill(pid, signal.SIGKILL)
    return newest_step(ckpt)


def elastic(loom, work):
    steps = 40
    ckpt = os.path.join(work, "elastic")
    keep = ("--set", "checkpoint.keep_last=0", "train.log_every=1")
    proc = subprocess.Popen(cmd(loom, ckpt, steps, "--elastic", "1:2", *keep),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed_after = kill_remote_after_a_save(proc, ckpt)
    killed_at, first_new_step, lines = time.time(), None, []
    for line in proc.stdout:  # the time from the kill to the re-formed job's first step (printed)
        lines.append(line)
        if first_new_step is None and line.startswith("step ") and any(l.startswith("resumed from") for l in lines):
            first_new_step = time.time() - killed_at
    proc.wait(timeout=180)
    out = "".join(lines)
    print(f"elastic: from the SIGKILL to the re-formed job's first step: {first_new_step:.2f} s")
    expect(proc.returncode == 0 and f"step {steps}/{steps}" in out, f"the elastic job exited {proc.returncode}", out)
    expect("lost 10.77.0.2; going on with 1 host (10.77.0.1:1): dp 1, grad_accum 2, micro-batch 4" in out,
           "the re-forming was not said", out)
    at = [l for l in out.splitlines() if l.startswith("resumed from")]
    expect(len(at) == 1, "no single resume line", out)
    step = int(at[0].split(" at step ")[1].split()[0])
    expect(killed_after <= step and step % 2 == 0, f"resumed from step {step}, killed after step {killed_after}", out)
    # By hand: the same step's checkpoint, resumed on the re-formed layout in one process.
    by_hand = os.path.join(work, "by-hand")
    os.makedirs(by_hand)
    shutil.copytree(os.path.join(ckpt, f"step-{step:08d}"), os.path.join(by_hand, f"step-{step:08d}"))
    r = subprocess.run([loom, "train", "--resume", "auto", "--save-every", "2", "--set", "train.batch=8",
                        "train.seq=64", f"train.steps={steps}", "model.layers=2", "train.val_every=0",
                        "train.val_batches=1", "train.threads=1", f"checkpoint.dir={by_hand}",
                        "checkpoint.keep_last=0", "parallel.dp=1", "train.grad_accum=2", "parallel.micro_batch=4"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    expect(r.returncode == 0, "the by-hand resume failed", r.stdout)
    expect(final_files(ckpt, steps, 1) == final_files(by_hand, steps, 1),
           "the elastic job's final weights differ from the by-hand resume's", out)

    ckpt = os.path.join(work, "below-min")
    proc = subprocess.Popen(cmd(loom, ckpt, steps, "--elastic", "2:2"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    kill_remote_after_a_save(proc, ckpt)
    out = proc.communicate(timeout=120)[0]
    expect(proc.returncode != 0 and "1 host (10.77.0.1:1) left, fewer than MIN 2: stopping" in out,
           f"below MIN: rc {proc.returncode}", out)
    rc, out, _ = run(loom, ckpt, steps, "--resume", "auto")
    expect(rc == 0 and f"step {steps}/{steps}" in out, f"the resume after a stop below MIN exited {rc}", out)


def main():
    loom = os.path.abspath(sys.argv[1])
    if subprocess.run(["ip", "netns", "add", "loom-probe"], capture_output=True).returncode != 0:
        print("SKIP: cannot create network namespaces here (needs root with CAP_SYS_ADMIN/NET_ADMIN)")
        sys.exit(77)
    subprocess.run(["ip", "netns", "del", "loom-probe"])
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

        ckpt = os.path.join(work, "frozen")  # comm.timeout_s 300: the beats, not rank 0's wait, end it
        proc = subprocess.Popen(cmd(loom, ckpt, 100000, "--set", "comm.timeout_s=300"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(ckpt, "latest")) and time.time() < deadline:
            time.sleep(0.05)
        pid = rank_pid(1, ckpt)
        expect(pid is not None, "the remote rank's process was not found", "")
        os.kill(pid, signal.SIGSTOP)
        t0 = time.time()
        try:
            out = proc.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            fail("a frozen remote rank did not end the job within 60 s", proc.communicate()[0])
        secs = time.time() - t0
        expect(proc.returncode != 0 and "rank 1 on host 10.77.0.2: no heartbeat" in out and secs < 40,
               f"frozen remote rank: rc {proc.returncode} after {secs:.1f} s", out)
        time.sleep(1)
        expect(rank_pid(1, ckpt) is None, "the frozen remote rank outlived its job", out)

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
        print("ok: trains, hung, killed + resume, frozen, signals, elastic, below-min across two hosts")
    finally:
        subprocess.run([NETNS, "down"])
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
