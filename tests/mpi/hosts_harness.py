"""What the namespace-hosts checks share (check_hosts.py, check_elastic_hosts.py): the harness
script, the skip where namespaces cannot be made, failing with the job's output, and the
by-hand resume an elastic job's weights are held to."""
import os
import shutil
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "scripts"))
from soak import final_files  # noqa: E402  (the soak script's checkpoint reader)

NETNS = os.path.join(here, "..", "..", "scripts", "netns_hosts.sh")


def fail(msg, out=""):
    print(out)
    print("FAIL:", msg)
    sys.exit(1)


def expect(cond, msg, out):
    if not cond:
        fail(msg, out)


def require_netns():
    """Exits 77 (ctest SKIP) where network namespaces cannot be made."""
    if subprocess.run(["ip", "netns", "add", "loom-probe"], capture_output=True).returncode != 0:
        print("SKIP: cannot create network namespaces here (needs root with CAP_SYS_ADMIN/NET_ADMIN)")
        sys.exit(77)
    subprocess.run(["ip", "netns", "del", "loom-probe"])


def resumed_steps(out):
    return [int(l.split(" at step ")[1].split()[0]) for l in out.splitlines() if l.startswith("resumed from")]


def by_hand_equal(ckpt, by_hand, step, steps, ranks, command, out, against=None):
    """Copies `ckpt`'s step `step` into `by_hand`, resumes from it with `command` (which trains
    into `by_hand` to `steps`), and fails unless the final rank files equal those of `against`
    (default `ckpt`) bit for bit."""
    os.makedirs(by_hand)
    shutil.copytree(os.path.join(ckpt, f"step-{step:08d}"), os.path.join(by_hand, f"step-{step:08d}"))
    r = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    expect(r.returncode == 0, "the by-hand resume failed", r.stdout)
    expect(final_files(against or ckpt, steps, ranks) == final_files(by_hand, steps, ranks),
           f"the final weights differ from the by-hand resume from step {step}", out)
