#!/usr/bin/env python3
"""Soak test for loom's fault handling: trains STEPS steps while a random rank is SIGKILLed
or SIGSTOPped every 40-80 steps, resuming each time with `--resume auto`, every other
launch without --save-every (so it saves only at its end, and a fault loses its progress);
at the end the final checkpoint must hold exactly the bytes of an uninterrupted run.
Reports the faults survived, the steps lost to each, and how long the job took to end:
a killed rank is seen at once by its pid; a stopped one by comm.timeout_s, after which the
--nproc supervisor SIGKILLs it (Note [Supervised launch]).

usage: scripts/soak.py [--loom build/release/loom] [--steps 300] [--seed 1] [--layout "--dp 2 --pp 2"]
                       [--stop-fraction 0.3]
"""
import argparse
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

EVERY = 10        # checkpoint.save_every
TIMEOUT_S = 10    # comm.timeout_s
GRACE_S = min(TIMEOUT_S, 10)  # the supervisor's grace after a rank fails


def train_cmd(a, ckpt, resume, save_every=True):
    layout = shlex.split(a.layout)
    ranks = 1
    for flag, value in zip(layout[::2], layout[1::2]):
        if flag in ("--dp", "--tp", "--pp"):
            ranks *= int(value)
    cmd = [a.loom, "train", "--nproc", str(ranks), *layout, "--json",
           *(["--save-every", str(EVERY)] if save_every else []), "--set", f"train.steps={a.steps}", "train.log_every=1", "model.layers=2", "train.val_every=0",
           "train.val_batches=1", "train.threads=1", f"checkpoint.dir={ckpt}", "checkpoint.keep_last=2",
           f"comm.timeout_s={TIMEOUT_S}"]
    if resume:
        cmd += ["--resume", "auto"]
    return cmd, ranks


def rank_pid(rank, ckpt):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env and ckpt.encode() in cmd and b"mpirun" not in cmd:
            return int(pid)
    return None


def newest_step(ckpt):
    try:
        with open(os.path.join(ckpt, "latest")) as f:
            return int(f.read().strip().split("-")[1])
    except OSError:
        return 0


def final_files(ckpt, steps, ranks):
    out = []
    for r in range(ranks):
        with open(os.path.join(ckpt, f"step-{steps:08d}", f"rank-{r:05d}.bin"), "rb") as f:
            out.append(f.read())
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loom", default=os.path.join(os.path.dirname(__file__), "..", "build", "release", "loom"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--layout", default="--dp 2 --pp 2")
    p.add_argument("--verbose", action="store_true", help="print the survivors' diagnoses of each kill")
    p.add_argument("--stop-fraction", type=float, default=0.3, help="share of faults that SIGSTOP instead of SIGKILL")
    a = p.parse_args()
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    rng = random.Random(a.seed)
    tmp = tempfile.mkdtemp(prefix="loom-soak-")
    try:
        ref, ckpt = os.path.join(tmp, "reference"), os.path.join(tmp, "soak")
        cmd, ranks = train_cmd(a, ref, False)
        t0 = time.time()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"soak: the uninterrupted run failed ({r.returncode}):\n{r.stderr}")
        print(f"soak: uninterrupted run of {a.steps} steps ({a.layout}, {ranks} ranks) took {time.time() - t0:.1f} s")

        kills, launches, step = [], 0, 0
        next_kill = rng.randint(40, 80)
        t0 = time.time()
        while True:
            cmd, _ = train_cmd(a, ckpt, launches > 0, save_every=launches % 2 == 0)
            launches += 1
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            killed = None
            for line in proc.stdout:
                if not line.startswith("{"):
                    continue
                step = json.loads(line).get("step", step)
                if killed is None and step >= next_kill and step < a.steps:
                    rank = rng.randrange(ranks)
                    pid = rank_pid(rank, ckpt)
                    if pid is None:
                        continue
                    sig = signal.SIGSTOP if rng.random() < a.stop_fraction else signal.SIGKILL
                    os.kill(pid, sig)
                    killed = {"rank": rank, "at_step": step, "time": time.time(), "signal": sig.name[3:],
                              "saves": "--save-every" in cmd}
            err = proc.stderr.read()
            proc.wait()
            if killed is None:
                if proc.returncode != 0:
                    sys.exit(f"soak: launch {launches} failed without a kill ({proc.returncode}):\n{err}")
                break
            killed["exit_s"] = time.time() - killed.pop("time")
            if proc.returncode == 0:
                sys.exit(f"soak: the job exited 0 after rank {killed['rank']} was killed")
            seen = re.findall(r"failed at global rank \d+ after ([0-9.]+) s", err)
            killed["survivors_saw_s"] = max(float(s) for s in seen) if seen else None
            if killed["signal"] == "STOP":  # survivors time out, the supervisor kills the stopped rank
                killed["named"] = f"rank {killed['rank']} (pid {pid}): killed, still running" in err
            else:
                killed["named"] = bool(re.search(rf"rank [0-9, ]*\b{killed['rank']}\b[0-9, ]* died", err) or
                                       f"rank {killed['rank']}: left no exit code" in err)
            if a.verbose:
                print(f"--- kill of rank {killed['rank']} at step {killed['at_step']}:\n" +
                      "\n".join(l for l in err.splitlines() if "failed at" in l or "rank" in l[:8]))
            killed["resume_from"] = newest_step(ckpt)
            killed["steps_lost"] = killed["at_step"] - killed["resume_from"]
            kills.append(killed)
            next_kill = killed["at_step"] + rng.randint(40, 80)
        took = time.time() - t0

        same = final_files(ckpt, a.steps, ranks) == final_files(ref, a.steps, ranks)
        print(f"soak: {a.steps} steps with {len(kills)} kills in {took:.1f} s ({launches} launches)")
        print(f"{'fault':>5} {'signal':>6} {'rank':>4} {'saves':>5} {'at step':>7} {'resumed from':>12} "
              f"{'steps lost':>10} {'job gone after':>14} {'rank named':>10}")
        for i, k in enumerate(kills, 1):
            print(f"{i:>5} {k['signal']:>6} {k['rank']:>4} {'yes' if k['saves'] else 'end':>5} {k['at_step']:>7} "
                  f"{k['resume_from']:>12} {k['steps_lost']:>10} {k['exit_s']:>12.2f} s "
                  f"{'yes' if k['named'] else 'NO':>10}")
        for sig, bound in [("KILL", TIMEOUT_S), ("STOP", TIMEOUT_S + GRACE_S + 3)]:
            ks = [k for k in kills if k["signal"] == sig]
            if ks:
                print(f"SIG{sig}: {len(ks)}, steps lost {sum(k['steps_lost'] for k in ks)}, fault to job exit max "
                      f"{max(k['exit_s'] for k in ks):.2f} s (bound {bound} s; comm.timeout_s = {TIMEOUT_S})")
        print("final weights and moments equal the uninterrupted run's: " + ("yes, byte for byte" if same else "NO"))
        bound = {"KILL": TIMEOUT_S, "STOP": TIMEOUT_S + GRACE_S + 3}
        ok = same and all(k["named"] and k["exit_s"] < bound[k["signal"]] for k in kills)
        sys.exit(0 if ok else 1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
