#!/usr/bin/python3
"""Decodes the TensorBoard event file of a `loom train --json --set train.tensorboard=DIR` run
with an independent reader - the record framing and CRC-32C written out here, the Event,
Summary and Value messages decoded by the protobuf library (python3-protobuf) from their
public definitions (tensorflow/core/util/event.proto, tensorflow/core/framework/summary.proto:
the field numbers below) - and checks every scalar against the values the JSON lines carry.

usage: check_tensorboard.py LOOM_BINARY
Exit 0 when they agree, 1 otherwise, 77 without python3-protobuf (ctest skip).
"""
import glob
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
except ImportError:
    print("SKIP: python3-protobuf is not installed (scripts/setup.sh installs it)")
    sys.exit(77)


def messages():
    """Event, Summary and Value classes from their public field numbers and types."""
    f = descriptor_pb2.FileDescriptorProto(name="tb_events.proto", package="tbcheck", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    value = f.message_type.add(name="Value")
    value.field.add(name="tag", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=T.TYPE_FLOAT, label=T.LABEL_OPTIONAL)
    summary = f.message_type.add(name="Summary")
    summary.field.add(name="value", number=1, type=T.TYPE_MESSAGE, type_name=".tbcheck.Value", label=T.LABEL_REPEATED)
    event = f.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=T.TYPE_DOUBLE, label=T.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=T.TYPE_MESSAGE, type_name=".tbcheck.Summary", label=T.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    desc = pool.FindMessageTypeByName("tbcheck.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


def crc32c(data):
    """Bit by bit, Castagnoli polynomial (reflected 0x82F63B78)."""
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def masked(c):
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    data = open(path, "rb").read()
    at = 0
    while at < len(data):
        n, = struct.unpack_from("<Q", data, at)
        head_crc, = struct.unpack_from("<I", data, at + 8)
        assert head_crc == masked(crc32c(data[at:at + 8])), f"length CRC at byte {at}"
        body = data[at + 12:at + 12 + n]
        body_crc, = struct.unpack_from("<I", data, at + 12 + n)
        assert body_crc == masked(crc32c(body)), f"record CRC at byte {at}"
        yield body
        at += 12 + n + 4


def main():
    loom = sys.argv[1]
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    Event = messages()
    tmp = tempfile.TemporaryDirectory()
    tb = os.path.join(tmp.name, "tb")
    run = subprocess.run([loom, "train", "--json", "--set", "train.steps=12", "--set", "train.log_every=1", "--set",
                          "train.val_every=4", "--set", "train.val_batches=1", "--set", "train.tensorboard=" + tb,
                          "--set", "checkpoint.dir=" + os.path.join(tmp.name, "ck")],
                         check=True, capture_output=True)
    lines = [json.loads(l) for l in run.stdout.decode().splitlines() if l.startswith("{")]
    files = glob.glob(os.path.join(tb, "events.out.tfevents.*"))
    assert len(files) == 1, files
    events = [Event.FromString(r) for r in records(files[0])]
    if events[0].file_version != "brain.Event:2":
        print(f"first event: file_version {events[0].file_version!r}")
        return 1
    got = {}
    for e in events[1:]:
        for v in e.summary.value:
            got[(e.step, v.tag)] = v.simple_value
    checked = 0
    names = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "tokens_per_s": "train/tokens_per_s",
             "val_loss": "val/loss", "val_bpb": "val/bpb"}
    for l in lines:
        for key, tag in names.items():
            if key not in l:
                continue
            have = got.get((l["step"], tag))
            want = l[key]
            # float32 in the event, the double in the JSON line
            if have is None or not math.isclose(have, want, rel_tol=1e-6, abs_tol=1e-30):
                print(f"step {l['step']} {tag}: event {have}, JSON line {want}")
                return 1
            checked += 1
    if checked < 12 * 4 + 3 * 2 or (12, "run/tokens_per_s") not in got:
        print(f"only {checked} values checked; tags seen: {sorted(set(t for _, t in got))}")
        return 1
    print(f"TensorBoard events: {len(events)} records, CRC-32C framing valid, {checked} scalars equal the JSON lines "
          f"(float32); tags {sorted(set(t for _, t in got))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
