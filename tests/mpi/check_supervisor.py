#!/usr/bin/env python3
"""The `loom train --nproc` supervisor ends what it started (Note [Supervised launch]).

usage: check_supervisor.py LOOM stopped-rank | supervisor-signals | stopped-mpirun | stopped-rank-default |
                            hung-rank | slow-rank | hung-rank-default

stopped-rank:       rank 1 of a dp2 job is SIGSTOPped; the other rank diagnoses it within
                    comm.timeout_s and fails, and the supervisor SIGKILLs the stopped rank
                    after its grace (min(timeout, 10 s)), naming it; the job must be gone
                    within timeout + grace + 3 s, and --resume auto then finishes the run.
supervisor-signals: the supervisor itself gets SIGTERM, SIGINT, then SIGKILL (one job each);
                    no rank and no mpirun may outlive it by more than a second, and the
                    checkpoint directory's lock is free for a restart.
stopped-rank-default: as stopped-rank with comm.timeout_s = 300: the supervisor sees the rank
                    stopped and ends the job within about 10 s, naming it (not 300 s later).
stopped-mpirun:     mpirun is SIGSTOPped while the ranks train (issue 59 finding 20); the
                    ranks finish and save, and the supervisor kills the stuck job 5 s after
                    the last rank recorded its exit, naming mpirun, and exits 0 (the ranks'
                    code); if the ranks take 10 s, the stopped mpirun ends the job first.
hung-rank:          rank 1 blocks for good in step 9 (LOOM_FAILPOINT=hang@8:1) with comm.hang_s = 3
                    and comm.timeout_s = 300: its heartbeat shows no CPU time and no collective,
                    and the supervisor ends the job within seconds, naming it (Note [Heartbeats]).
slow-rank:          rank 1 computes for 8 s in step 9 (busy@8:1:8) while rank 0 waits in the
                    collective, with comm.hang_s = 3: no false alarm, the job finishes and exits 0.
hung-rank-default:  as hung-rank with the defaults (comm.hang_s 25, comm.timeout_s 300): the job
                    ends within 30 s of the hang (issue 59), measured from the save of step 5
                    (steps 6 to 8 run before the hang; 5 s of slack for them on a loaded machine).
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from soak import rank_pid  # noqa: E402  (the soak script's process finder)

TIMEOUT_S = 4


def args(loom, ckpt, steps, extra=(), timeout_s=TIMEOUT_S):
    return [loom, "train", "--nproc", "2", "--dp", "2", "--set", "train.batch=8", "train.seq=64",
            f"train.steps={steps}", "model.layers=2", "train.val_every=0", "train.val_batches=1",
            "train.threads=1", f"checkpoint.dir={ckpt}", f"comm.timeout_s={timeout_s}", "--save-every", "5",
            *extra]


def fail(msg, out=""):
    print(out)
    print("FAIL:", msg)
    sys.exit(1)


def launch(loom, ckpt, steps, timeout_s=TIMEOUT_S, extra=(), env=None):
    """The job, once it has saved a step (so training runs)."""
    proc = subprocess.Popen(args(loom, ckpt, steps, extra, timeout_s=timeout_s), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(ckpt, "latest")):
        if proc.poll() is not None or time.time() > deadline:
            fail("the run ended before its first checkpoint", proc.communicate()[0])
        time.sleep(0.02)
    return proc


def start(loom, ckpt, steps, timeout_s=TIMEOUT_S):
    proc = launch(loom, ckpt, steps, timeout_s)
    pids = [rank_pid(r, ckpt) for r in range(2)]
    if None in pids:
        fail(f"rank processes not found: {pids}")
    return proc, pids


def mpirun_pids(ckpt):
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            exe = os.path.basename(cmd.split(b"\0")[0])
            if exe in (b"mpirun", b"mpiexec", b"orterun", b"prterun") and ckpt.encode() in cmd:
                out.append(int(pid))
    return out


def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def restart(loom, ckpt, what):
    """--resume auto takes the directory (its lock is free) and trains two more steps."""
    # The newest complete step (a kill between publishing a step and updating `latest`
    # leaves `latest` one behind; --resume auto takes the newest complete one).
    newest = max(int(d[5:]) for d in os.listdir(ckpt) if len(d) == 13 and d.startswith("step-")
                 and os.path.exists(os.path.join(ckpt, d, "manifest.json")))
    rc = subprocess.run(args(loom, ckpt, newest + 2, ["--resume", "auto"]), stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
    if rc.returncode != 0 or f"resumed from {ckpt}/step-" not in rc.stdout:
        fail(f"{what}: the restart with --resume auto exited {rc.returncode}", rc.stdout)


def stopped_rank(loom, tmp):
    ckpt = os.path.join(tmp, "stopped")
    proc, pids = start(loom, ckpt, 100000)
    os.kill(pids[1], signal.SIGSTOP)
    t0 = time.time()
    grace = min(TIMEOUT_S, 10)
    try:
        out = proc.communicate(timeout=TIMEOUT_S + grace + 30)[0]
    except subprocess.TimeoutExpired:
        os.kill(pids[1], signal.SIGKILL)
        fail("the job outlived a stopped rank by 30 s more than timeout + grace", proc.communicate()[0])
    took = time.time() - t0
    print(out)
    print(f"rank 1 (pid {pids[1]}) SIGSTOPped; the job exited {proc.returncode} {took:.2f} s later "
          f"(comm.timeout_s = {TIMEOUT_S}, grace {grace} s)")
    if running(pids[1]):
        os.kill(pids[1], signal.SIGKILL)
        fail("the stopped rank is still there")
    if proc.returncode == 0:
        fail("the job exited 0 with a stopped rank")
    if took > TIMEOUT_S + grace + 3:
        fail(f"the job took {took:.1f} s, more than timeout + grace + 3 s")
    for want in ["the supervisor killed:", f"rank 1 (pid {pids[1]}): killed, still running",
                 "loom: error: rank 0: "]:
        if want not in out:
            fail(f"output lacks: {want}")
    for noise in ["PMIX ERROR", "loom: error: loom: error:"]:
        if noise in out:
            fail(f"output holds: {noise}")
    restart(loom, ckpt, "after the stopped rank")


def supervisor_signals(loom, tmp):
    for sig in [signal.SIGTERM, signal.SIGINT, signal.SIGKILL]:
        ckpt = os.path.join(tmp, "sig-" + sig.name)
        proc, pids = start(loom, ckpt, 100000)
        mpirun = mpirun_pids(ckpt)
        os.kill(proc.pid, sig)
        t0 = time.time()
        survivors = pids + mpirun
        while time.time() - t0 < 1.0 and any(running(p) for p in survivors):
            time.sleep(0.01)
        left = [p for p in survivors if running(p)]
        took = time.time() - t0
        out = proc.communicate()[0]
        for p in left:
            os.kill(p, signal.SIGKILL)
        if left:
            fail(f"{sig.name} to the supervisor: {left} of ranks {pids} / mpirun {mpirun} still run after 1 s", out)
        print(f"{sig.name} to the supervisor: ranks {pids} and mpirun {mpirun} gone {took:.2f} s later")
        restart(loom, ckpt, sig.name)


def stopped_mpirun(loom, tmp):
    ckpt = os.path.join(tmp, "stopped-mpirun")
    steps = 40
    proc = launch(loom, ckpt, steps)
    launchers = mpirun_pids(ckpt)
    pids = [p for p in (rank_pid(r, ckpt) for r in range(2)) if p]
    if not launchers:
        fail("mpirun's process was not found", proc.communicate()[0])
    for p in launchers:
        os.kill(p, signal.SIGSTOP)
    t0 = time.time()
    try:
        out = proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        for p in launchers + pids:
            os.kill(p, signal.SIGKILL)
        fail("the job never ended with mpirun stopped", proc.communicate()[0])
    took = time.time() - t0
    print(out)
    print(f"mpirun {launchers} SIGSTOPped; the job exited {proc.returncode} {took:.2f} s later")
    left = [p for p in launchers + pids if running(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    if left:
        fail(f"{left} still run after the job ended")
    if "mpirun: " not in out or "killed with mpirun (pid" not in out:
        fail("the supervisor did not name the stuck mpirun")
    # The ranks finish their 35 remaining steps within seconds: then the job ends 5 s after
    # their last record, exiting 0. On a machine slow enough that they take 10 s, the
    # stopped launcher ends the job first, non-zero, and --resume auto continues it.
    if proc.returncode == 0:
        if not os.path.exists(os.path.join(ckpt, f"step-{steps:08d}", "manifest.json")):
            fail("the job exited 0 but its last step was not saved")
    elif "stopped (SIGSTOP) for 10 s" in out:
        restart(loom, ckpt, "after the stopped mpirun")
    else:
        fail(f"the job exited {proc.returncode} without saying the launcher was stopped")


def stopped_rank_default(loom, tmp):
    """A SIGSTOPped rank with the default comm.timeout_s (300 s): the supervisor sees it
    stopped and ends the job within about 10 s, naming it (issue 59: it held the job 5 min)."""
    ckpt = os.path.join(tmp, "stopped-default")
    proc, pids = start(loom, ckpt, 100000, timeout_s=300)
    os.kill(pids[1], signal.SIGSTOP)
    t0 = time.time()
    try:
        out = proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        os.kill(pids[1], signal.SIGKILL)
        fail("the job outlived a stopped rank by 60 s", proc.communicate()[0])
    took = time.time() - t0
    print(out)
    print(f"rank 1 (pid {pids[1]}) SIGSTOPped, comm.timeout_s 300: the job exited {proc.returncode} {took:.2f} s later")
    left = [p for p in pids if running(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    if left:
        fail(f"ranks {left} still run after the job ended")
    if proc.returncode == 0:
        fail("the job exited 0 with a stopped rank")
    if f"rank 1 (pid {pids[1]}): stopped (SIGSTOP) for 10 s" not in out:
        fail("the supervisor did not name the stopped rank")
    if took > 30:
        fail(f"the job took {took:.1f} s, more than 30 s")
    restart(loom, ckpt, "after the stopped rank")


def hung(loom, tmp, hang_s):
    """Rank 1 blocks in step 9; the job must end within hang_s plus the check's slack."""
    ckpt = os.path.join(tmp, f"hung-{hang_s}")
    extra = ["--set", f"comm.hang_s={hang_s}"] if hang_s else []
    env = dict(os.environ, LOOM_FAILPOINT="hang@8:1")
    proc = launch(loom, ckpt, 100000, timeout_s=300, extra=extra, env=env)
    t0 = time.time()  # step 5 is saved: the hang comes within a few steps
    limit = (hang_s or 25) + 10
    try:
        out = proc.communicate(timeout=limit + 30)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        fail(f"the job outlived a hung rank by {limit + 30} s", proc.communicate()[0])
    took = time.time() - t0
    print(out)
    print(f"rank 1 hangs in step 9, comm.hang_s {hang_s or 'default'}: the job exited {proc.returncode} "
          f"{took:.2f} s after step 5 was saved")
    if proc.returncode == 0:
        fail("the job exited 0 with a hung rank")
    if "rank 1 (pid" not in out or "hung in step 9: no CPU time and no collective" not in out:
        fail("the supervisor did not name the hung rank")
    if "rank 0 (pid" in out and "): hung" in out.split("rank 0 (pid", 1)[1].split("\n", 1)[0]:
        fail("rank 0, waiting in a collective, was taken for hung")
    if took > limit:
        fail(f"the job took {took:.1f} s, more than {limit} s")
    restart(loom, ckpt, "after the hung rank")


def hung_rank(loom, tmp):
    hung(loom, tmp, 3)


def hung_rank_default(loom, tmp):
    hung(loom, tmp, None)


def slow_rank(loom, tmp):
    ckpt = os.path.join(tmp, "slow")
    env = dict(os.environ, LOOM_FAILPOINT="busy@8:1:8")
    rc = subprocess.run(args(loom, ckpt, 12, ["--set", "comm.hang_s=3"], timeout_s=300), stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, env=env)
    print(rc.stdout)
    if "rank 1 computes for 8 s at step 8" not in rc.stdout:
        fail("the failpoint did not run")
    if rc.returncode != 0 or "hung" in rc.stdout or "the supervisor killed" in rc.stdout:
        fail(f"a rank computing for 8 s (its peer waiting in a collective) ended the job: exit {rc.returncode}")


def main():
    loom, mode = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="loom-supervisor-")
    try:
        {"stopped-rank": stopped_rank, "supervisor-signals": supervisor_signals,
         "stopped-mpirun": stopped_mpirun, "stopped-rank-default": stopped_rank_default,
         "hung-rank": hung_rank, "slow-rank": slow_rank, "hung-rank-default": hung_rank_default}[mode](loom, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
