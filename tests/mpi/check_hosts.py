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
  signals:     the supervisor gets SIGTERM: no rank outlives it by more than 5 s.
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
from soak import newest_step, rank_pid  # noqa: E402

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
        print("ok: trains, hung, killed + resume, frozen, signals across two hosts")
    finally:
        subprocess.run([NETNS, "down"])
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
