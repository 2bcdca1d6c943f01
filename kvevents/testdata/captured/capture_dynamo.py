#!/usr/bin/env python3
"""Captures whole messages of NVIDIA Dynamo 1.6.1's event plane into the
golden files of this directory, for the tests of package kvevents/dynamo
(../../dynamo/golden_test.go). Like capture.py, it documents how the bytes
were made; it is not run by the tests or by CI.

NAME.frames is one ZMQ message, its four frames (topic, publisher id,
sequence, data) as a msgpack array of bin; NAME.json is what they decode
to (msgspec): the frames' numbers, the envelope's fields and the payload.

    capture_dynamo.py OUTDIR frames
        ai-dynamo-runtime's own KvEventPublisher and WorkerMetricsPublisher
        on a DistributedRuntime with file discovery (whose event channels
        say where to subscribe): stores, a removal, kv_metrics of two ranks.

    capture_dynamo.py OUTDIR mocker MODEL_DIR
        a dynamo.mocker worker of ai-dynamo 1.6.1 (its simulated vLLM
        engine keeps a real prefix cache) serving one chat request through
        dynamo.frontend: its kv-events, kv_metrics and forward-pass-metrics
        messages, and the same blocks from its vLLM-format port
        (--zmq-kv-events-ports) as NAME.msgpack/NAME.json in capture.py's
        format. MODEL_DIR is a tokenizer-only Hugging Face model directory
        (tokenizer.json, tokenizer_config.json with a chat template,
        config.json, generation_config.json; a vocabulary of a few thousand
        ids, since the mocker emits output ids up to about 2,000).

Setup (Python 3.11; no GPU):

    python3 -m venv /tmp/dyn
    /tmp/dyn/bin/pip install --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1
    /tmp/dyn/bin/pip install msgspec pyzmq aiohttp certifi kubernetes prometheus-client \
        redis tqdm transformers typing-extensions zstandard tokenizers uvloop jinja2
    /tmp/dyn/bin/python kvevents/testdata/captured/capture_dynamo.py kvevents/testdata/captured frames
    /tmp/dyn/bin/python kvevents/testdata/captured/capture_dynamo.py kvevents/testdata/captured mocker MODEL_DIR

(ai-dynamo's declared dependency aisimulate is only needed by its planner,
hence --no-deps; the "frames" capture needs ai-dynamo-runtime, msgspec and
pyzmq only.) Every process it starts is stopped before it returns; all
addresses are 127.0.0.1.
"""

import json
import os
import shutil
import sys
import time

import msgspec
import zmq


def jsonable(v):
    if isinstance(v, bytes):
        return {"bytes": v.hex()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    return v



DYNAMO_FRAMES_PUBLISHER = r"""
import asyncio, sys
from dynamo._core import DistributedRuntime, KvEventPublisher, WorkerMetricsPublisher

async def main():
    loop = asyncio.get_running_loop()
    rt = DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
    ep = rt.endpoint("kvroute.capture.generate")
    pub = KvEventPublisher(ep, kv_block_size=4, dp_rank=0)
    metrics = WorkerMetricsPublisher()
    await metrics.create_endpoint(ep)
    print(ep.connection_id(), flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    pub.publish_stored(list(range(100, 108)), [4, 4], [11, 12], parent_hash=None)
    pub.publish_stored(list(range(108, 112)), [4], [13], parent_hash=12)
    pub.publish_removed([13])
    await asyncio.sleep(0.5)
    metrics.publish(0, 7, 19)
    await asyncio.sleep(0.5)
    metrics.publish(1, None, 3)
    await asyncio.sleep(2)
    pub.shutdown()
    rt.shutdown()

asyncio.run(main())
"""


def frames_meta(producer, description, frames):
    """What a 4-frame event-plane message decodes to, for NAME.json."""
    topic, publisher, seq, data = frames
    size = int.from_bytes(data[1:5], "big")
    env = msgspec.msgpack.decode(data[5:5 + size])
    payload = env.pop("payload")
    return {
        "producer": producer,
        "description": description,
        "topic": topic.decode(),
        "publisher_id": int.from_bytes(publisher, "big"),
        "seq": int.from_bytes(seq, "big"),
        "frame_version": data[0],
        "envelope_length": size,
        "envelope": jsonable(env),
        "payload": jsonable(msgspec.msgpack.decode(payload)),
    }


def write_frames(outdir, name, frames, meta):
    """NAME.frames: the message's frames as a msgpack array of bin;
    NAME.json: what they decode to."""
    with open(os.path.join(outdir, name + ".frames"), "wb") as f:
        f.write(msgspec.msgpack.encode([bytes(x) for x in frames]))
    with open(os.path.join(outdir, name + ".json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


def channel_endpoints(kvdir):
    """topic -> ZMQ endpoint of the event channels in a file-discovery dir."""
    import glob
    out = {}
    for path in glob.glob(os.path.join(kvdir, "v1", "event_channels", "*")):
        with open(path) as f:
            ch = json.load(f)
        out[ch["topic"]] = ch["transport"]["config"]["endpoint"]
    return out


def dynamo_env(kvdir):
    return dict(os.environ, DYN_FILE_KV=kvdir, DYN_LOG="warn", NO_COLOR="1",
                DYN_EVENT_PLANE_HOST="127.0.0.1", DYN_TCP_RPC_HOST="127.0.0.1",
                DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1", DYN_SYSTEM_HOST="127.0.0.1")


def subscribe_all(ctx, endpoints):
    poller, socks = zmq.Poller(), {}
    for name, ep in endpoints.items():
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(ep)
        socks[s] = name
        poller.register(s, zmq.POLLIN)
    return poller, socks


def collect(poller, socks, seconds):
    got, end = [], time.time() + seconds
    while time.time() < end:
        for s, _ in poller.poll(100):
            got.append((socks[s], s.recv_multipart()))
    return got


def capture_dynamo_frames(outdir):
    """Whole event-plane messages (all four ZMQ frames) from
    ai-dynamo-runtime's KvEventPublisher and WorkerMetricsPublisher on a
    DistributedRuntime with file discovery."""
    import subprocess
    import tempfile

    kvdir = tempfile.mkdtemp(prefix="kvroute-capture-")
    child = subprocess.Popen([sys.executable, "-c", DYNAMO_FRAMES_PUBLISHER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=dynamo_env(kvdir), text=True)
    worker = int(child.stdout.readline())
    for _ in range(50):  # the publishers register in the background
        eps = channel_endpoints(kvdir)
        if "kv-events" in eps and "kv_metrics" in eps:
            break
        time.sleep(0.1)
    ctx = zmq.Context.instance()
    poller, socks = subscribe_all(ctx, eps)
    time.sleep(1)  # let the subscriptions reach the publishers
    child.stdin.write("go\n")
    child.stdin.flush()
    got = collect(poller, socks, 3)
    child.stdin.close()
    child.wait(timeout=30)
    shutil.rmtree(kvdir, ignore_errors=True)
    producer = "ai-dynamo-runtime 1.6.1 %s (ZMQ event plane, worker %d)"
    names = {
        "kv-events": ["dynamo161_zmq_stored_root", "dynamo161_zmq_stored_child", "dynamo161_zmq_removed"],
        "kv_metrics": ["dynamo161_zmq_kv_metrics_rank0", "dynamo161_zmq_kv_metrics_rank1"],
    }
    descriptions = {
        "dynamo161_zmq_stored_root": "publish_stored: two root blocks of 4 tokens",
        "dynamo161_zmq_stored_child": "publish_stored: a child block of the second",
        "dynamo161_zmq_removed": "publish_removed: the child block",
        "dynamo161_zmq_kv_metrics_rank0": "WorkerMetricsPublisher.publish(dp_rank=0, active_decode_blocks=7, kv_used_blocks=19)",
        "dynamo161_zmq_kv_metrics_rank1": "WorkerMetricsPublisher.publish(dp_rank=1, active_decode_blocks=None, kv_used_blocks=3)",
    }
    written = []
    for topic, frames in got:
        if not names.get(topic):
            continue
        name = names[topic].pop(0)
        what = "KvEventPublisher" if topic == "kv-events" else "WorkerMetricsPublisher"
        write_frames(outdir, name, frames, frames_meta(producer % (what, worker), descriptions[name], frames))
        written.append(name)
    print("captured:", ", ".join(written))


def capture_dynamo_mocker(outdir, model):
    """Messages of a live dynamo.mocker worker (ai-dynamo 1.6.1) serving one
    chat request through dynamo.frontend: its event plane (kv-events,
    kv_metrics, forward-pass-metrics) and its vLLM-format KV events
    (--zmq-kv-events-ports) for the same blocks. MODEL is a tokenizer-only
    Hugging Face model directory (tokenizer.json, tokenizer_config.json with
    a chat template, config.json, generation_config.json)."""
    import socket
    import subprocess
    import tempfile
    import urllib.request

    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    kvdir = tempfile.mkdtemp(prefix="kvroute-capture-")
    env = dynamo_env(kvdir)
    vllm_port, http_port = free_port(), free_port()
    mocker = subprocess.Popen([sys.executable, "-m", "dynamo.mocker", "--model-path", model, "--model-name", "tiny",
                               "--block-size", "16", "--num-gpu-blocks-override", "800", "--discovery-backend", "file",
                               "--request-plane", "tcp", "--event-plane", "zmq", "--speedup-ratio", "1",
                               "--zmq-kv-events-ports", str(vllm_port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    frontend = subprocess.Popen([sys.executable, "-m", "dynamo.frontend", "--http-port", str(http_port),
                                 "--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq",
                                 "--router-mode", "round-robin"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{http_port}/v1"
        for _ in range(120):
            try:
                if b'"tiny"' in urllib.request.urlopen(base + "/models", timeout=2).read():
                    break
            except OSError:
                pass
            time.sleep(0.5)
        eps = channel_endpoints(kvdir)
        eps["vllm"] = f"tcp://127.0.0.1:{vllm_port}"
        ctx = zmq.Context.instance()
        poller, socks = subscribe_all(ctx, eps)
        time.sleep(1.5)  # an idle forward pass comes once a second
        body = json.dumps({"model": "tiny", "max_tokens": 20, "messages": [
            {"role": "system", "content": "You are a helpful assistant that answers every question with great care and precision, citing sources."},
            {"role": "user", "content": "Hello there, how are you doing today? Tell me about the weather."}]}).encode()
        req = urllib.request.Request(base + "/chat/completions", body, {"content-type": "application/json"})
        urllib.request.urlopen(req, timeout=60).read()
        got = collect(poller, socks, 2.5)
    finally:
        for p in (frontend, mocker):
            p.terminate()
        for p in (frontend, mocker):
            p.wait(timeout=30)
        shutil.rmtree(kvdir, ignore_errors=True)
    producer = "ai-dynamo 1.6.1 dynamo.mocker (vLLM backend, block 16, 800 blocks), one chat request via dynamo.frontend"
    firsts = {}
    for topic, frames in got:
        if topic == "vllm":
            key = "vllm" if "vllm" not in firsts else "vllm_child"
        elif topic == "kv-events":
            key = "kv-events" if "kv-events" not in firsts else "kv-events_child"
        elif topic == "kv_metrics":
            p = frames_meta("", "", frames)["payload"]
            key = "kv_metrics" if p.get("kv_used_blocks") else None
        elif topic == "forward-pass-metrics":
            p = frames_meta("", "", frames)["payload"]
            if p["scheduled_requests"]["num_prefill_requests"]:
                key = "fpm_prefill"
            elif p["scheduled_requests"]["num_decode_requests"]:
                key = "fpm_decode"
            else:
                key = "fpm_idle"
        else:
            key = None
        if key and key not in firsts:
            firsts[key] = frames
    plan = [
        ("kv-events", "dynamo161_mocker_kv_events_prompt", "kv-events: the prompt's blocks (RouterEvent with tokens_hash)"),
        ("kv-events_child", "dynamo161_mocker_kv_events_output", "kv-events: a block of generated tokens, child of the prompt"),
        ("kv_metrics", "dynamo161_mocker_kv_metrics", "kv_metrics while the request runs"),
        ("fpm_prefill", "dynamo161_mocker_fpm_prefill", "forward-pass-metrics of the prefill step"),
        ("fpm_decode", "dynamo161_mocker_fpm_decode", "forward-pass-metrics of a decode step"),
        ("fpm_idle", "dynamo161_mocker_fpm_idle", "forward-pass-metrics while idle (once a second)"),
    ]
    written = []
    for key, name, description in plan:
        if key in firsts:
            write_frames(outdir, name, firsts[key], frames_meta(producer, description, firsts[key]))
            written.append(name)
    # The same blocks in vLLM's format, from the mocker's --zmq-kv-events-ports.
    for key, name in (("vllm", "dynamo161_mocker_vllm_prompt"), ("vllm_child", "dynamo161_mocker_vllm_output")):
        if key in firsts:
            topic, seq, payload = firsts[key]
            with open(os.path.join(outdir, name + ".msgpack"), "wb") as f:
                f.write(payload)
            meta = {"producer": producer + ", --zmq-kv-events-ports (vLLM format)",
                    "description": "the blocks of the kv-events message of the same step, as vLLM publishes them",
                    "topic": topic.decode(), "seq": int.from_bytes(seq, "big"),
                    "batch": jsonable(msgspec.msgpack.decode(payload))}
            with open(os.path.join(outdir, name + ".json"), "w") as f:
                json.dump(meta, f, indent=1)
                f.write("\n")
            written.append(name)
    print("captured:", ", ".join(written))


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] not in ("frames", "mocker") or (sys.argv[2] == "mocker" and len(sys.argv) < 4):
        raise SystemExit("usage: capture_dynamo.py OUTDIR frames | capture_dynamo.py OUTDIR mocker MODEL_DIR")
    if sys.argv[2] == "frames":
        capture_dynamo_frames(sys.argv[1])
    else:
        capture_dynamo_mocker(sys.argv[1], sys.argv[3])
