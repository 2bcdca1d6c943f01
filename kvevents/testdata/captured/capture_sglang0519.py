#!/usr/bin/env python3
"""Captures the positional salted store of SGLang 0.5.18/0.5.19 into the
golden files of this directory (NAME.msgpack: one ZMQ payload frame;
NAME.json: what it decodes to, by msgspec, plus what produced it).

SGLang 0.5.18 and 0.5.19 publish array-like events; a salted store is a
BlockStoredWithMetadata, whose trailing kw_only field `metadata` (the struct
BlockStoredMetadata, written as the map {"cache_salt": salt}) is an 8th
array element where vLLM's array has lora_name. From 0.5.20 on SGLang
map-encodes events (see capture.py for 0.5.23).

Like capture.py, this documents how the bytes were made; it is not run by
the tests or by CI.

Setup (Python 3.11; no GPU, no torch):

    python3 -m venv /tmp/cap519
    /tmp/cap519/bin/pip install --no-deps sglang==0.5.19
    /tmp/cap519/bin/pip install msgspec pyzmq pydantic psutil
    /tmp/cap519/bin/python kvevents/testdata/captured/capture_sglang0519.py kvevents/testdata/captured

What is real and what stands in: the event structs, ZmqEventPublisher
(sglang/srt/disaggregation/kv_events.py) and KVCacheEventRecorder
(sglang/srt/mem_cache/events.py) are SGLang 0.5.19's own, publishing over
real ZMQ sockets to this script's SUB socket. The radix-tree node and key
objects and the page hash function (a C++ extension built through torch)
stand in, as in capture.py: hashes are SHA-256 chains over the page
tokens, opaque to consumers as in SGLang. Stand-ins are modules created in
this process only; no installed file is edited.
"""

import hashlib
import json
import logging
import os
import site
import sys
import time
import types
from array import array

import msgspec
import zmq

SP = site.getsitepackages()[0]
VERSION = "0.5.19"


def package_stub(name):
    """A package whose submodules load from the installed files, without
    running its __init__ (sglang's pulls in torch)."""
    m = types.ModuleType(name)
    m.__path__ = [os.path.join(SP, *name.split("."))]
    sys.modules[name] = m
    return m


def stand_in(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


for n in ["sglang", "sglang.srt", "sglang.srt.disaggregation", "sglang.srt.mem_cache", "sglang.srt.utils"]:
    package_stub(n)


def hash_str_to_int64(hash_str):
    # Copy of sglang.srt.mem_cache.utils.hash_str_to_int64 (that module
    # imports torch kernels).
    v = int(hash_str[:16], 16)
    return v - 2**64 if v >= 2**63 else v


def page_hashes(key, prior, page_size):
    """Stand-in for SGLang's native page hash: a SHA-256 chain over each
    page's tokens, as hex strings."""
    out = []
    units = list(key)
    for s in range(0, len(units), page_size):
        h = hashlib.sha256((prior or "").encode() + repr(units[s:s + page_size]).encode()).hexdigest()
        out.append(h)
        prior = h
    return out


def compute_node_hash_values(node, page_size):
    prior = node.parent.hash_value[-1] if node.parent is not None and node.parent.hash_value else None
    return page_hashes(node.key, prior, page_size)


def compute_node_event_hash_values(node, page_size):
    if node.event_hash_value is None:
        parent = node.parent.event_hash_value if node.parent is not None and node.parent.event_hash_value else None
        prior = parent[-1] if parent else hashlib.sha256(b"sglang-cache-salt-v1\0" + (node.key.cache_salt or "").encode()).hexdigest()
        node.event_hash_value = page_hashes(node.key, prior, page_size)
    return node.event_hash_value


stand_in("sglang.srt.mem_cache.utils", compute_node_hash_values=compute_node_hash_values,
         compute_node_event_hash_values=compute_node_event_hash_values, hash_str_to_int64=hash_str_to_int64)

import sglang.srt.disaggregation.kv_events as skv  # noqa: E402  (the real module)
import sglang.srt.mem_cache.events as sev  # noqa: E402  (the real recorder)


class Key:
    """Stand-in for sglang.srt.mem_cache.radix_cache.RadixKey: raw token
    ids and the request's cache salt."""

    def __init__(self, token_ids, cache_salt=None):
        self.token_ids = array("q", token_ids)
        self.extra_key, self.cache_salt, self.is_bigram = None, cache_salt, False

    def __len__(self):
        return len(self.token_ids)

    def __iter__(self):
        return iter(self.token_ids)


class Node:
    """Stand-in for a radix-tree node: the attributes the recorder reads."""

    def __init__(self, key, parent):
        self.key, self.parent = key, parent
        self.hash_value = None
        self.event_hash_value = None


def root():
    r = Node(Key([]), None)
    r.hash_value = []
    return r


def chain(recorder, chunks, cache_salt=None):
    nodes, parent = [], root()
    for chunk in chunks:
        n = Node(Key(chunk, cache_salt), parent)
        recorder.record_store(n)
        nodes.append(n)
        parent = n
    return nodes


def tokens(n, base):
    return list(range(base, base + n))


def scenarios():
    # One batch: an unsalted chain, the same tokens salted, a remove of the
    # salted child; page size 4, so 8 + 4 tokens make 3 blocks per chain.
    rec = sev.KVCacheEventRecorder(enabled=True, page_size=4)
    chunks = [tokens(8, 600), tokens(4, 608)]
    chain(rec, chunks)
    salted = chain(rec, chunks, cache_salt="tenant-a")
    rec.record_remove(salted[1])
    return [("sglang0519_salt_positional_dp0", 0, rec.take(),
             "salted stores as BlockStoredWithMetadata (8 array elements, {cache_salt} last) beside unsalted 7-element stores, then a remove")]


def jsonable(v):
    if isinstance(v, bytes):
        return {"bytes": v.hex()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    return v


def capture(outdir):
    logging.basicConfig(level=logging.WARNING)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    base = sub.bind_to_random_port("tcp://127.0.0.1", min_port=20000, max_port=40000)
    written = []
    for name, rank, events, description in scenarios():
        # SGLang connects to a concrete host (it binds only wildcards).
        pub = skv.ZmqEventPublisher(attn_dp_rank=rank, endpoint=f"tcp://127.0.0.1:{base}", topic="kv-events")
        time.sleep(2)  # let the connection and subscription settle
        batch = skv.KVEventBatch(ts=time.time(), events=events)
        for attempt in range(3):
            pub.publish(batch)
            try:
                topic, seq, payload = sub.recv_multipart()
                break
            except zmq.Again:
                if attempt == 2:
                    raise
        pub.shutdown()
        decoded = msgspec.msgpack.decode(payload)
        with open(os.path.join(outdir, name + ".msgpack"), "wb") as f:
            f.write(payload)
        meta = {
            "producer": f"sglang {VERSION} ZmqEventPublisher + KVCacheEventRecorder",
            "description": description,
            "topic": topic.decode(),
            "seq": int.from_bytes(seq, "big"),
            "batch": jsonable(decoded),
        }
        with open(os.path.join(outdir, name + ".json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
        written.append(name)
    print("captured:", ", ".join(written))


if __name__ == "__main__":
    capture(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
