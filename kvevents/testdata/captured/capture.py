#!/usr/bin/env python3
"""Captures KV event batches from the engines' own publisher code into the
golden files of this directory (NAME.msgpack: one ZMQ payload frame;
NAME.json: what it decodes to, by msgspec, plus what produced it).

The Go tests (../../captured_test.go) decode every file and check each field
against its JSON. This script is documentation of how the bytes were made;
it is not run by the tests or by CI.

Setup (Python 3.11; no GPU, no torch):

    python3 -m venv /tmp/cap
    /tmp/cap/bin/pip install --no-deps vllm==0.33.0 sglang==0.5.23 ai-dynamo-runtime==1.6.1
    /tmp/cap/bin/pip install msgspec pyzmq pydantic cbor2 psutil urllib3 uvloop
    /tmp/cap/bin/python kvevents/testdata/captured/capture.py kvevents/testdata/captured

What is real and what stands in:

  * vLLM: the event structs and ZmqEventPublisher are vLLM's own
    (vllm/distributed/kv_events.py), publishing over real ZMQ sockets to
    this script's SUB socket; the replay socket is exercised once. The
    per-block extra_keys, the block hashes and their int/bytes forms come
    from vLLM's own functions in vllm/v1/core/kv_cache_utils.py
    (generate_block_hash_extra_keys, to_event_extra_keys, hash_block_tokens,
    maybe_convert_block_hash, with vllm.utils.hashing.sha256_cbor), taken
    from the installed file's source because importing the module pulls
    in torch. The kind annotation of stores mirrors KVCacheManager.take_events.
  * SGLang: the event structs, ZmqEventPublisher
    (sglang/srt/disaggregation/kv_events.py) and KVCacheEventRecorder
    (sglang/srt/mem_cache/events.py, default and "dynamo" formats, page
    sizes 1 and 4, Eagle bigram keys, cache_salt, LoRA names) are SGLang's
    own. The radix-tree node and key objects, and the page hash function
    (a C++ extension built through torch), stand in: hashes are SHA-256
    chains over the page tokens, opaque to consumers as in SGLang.
  * Stand-ins are modules created in this process only; no installed file
    is edited.

  * Dynamo: ai-dynamo-runtime's own KvEventPublisher, on a
    DistributedRuntime with in-memory discovery and its ZMQ event plane,
    runs in a child process (it prints the port its PUB socket bound);
    this script subscribes and records the event-plane messages:
    [topic, publisher id, sequence, envelope], the envelope being a version
    byte, a 4-byte big-endian length and a msgpack map whose "payload" is
    the msgpack list of RouterEvents (rmp_serde named maps). NAME.msgpack
    is that payload; NAME.json has it decoded, with the envelope fields.
    Whole event-plane messages (all four frames, kv_metrics and
    forward-pass-metrics too, and a live dynamo.mocker worker's) are
    captured by capture_dynamo.py.
"""

import __future__
import ast
import hashlib
import json
import logging
import os
import site
import sys
import time
import types
from array import array
from dataclasses import dataclass, field
from typing import Any, Optional

import msgspec
import zmq

SP = site.getsitepackages()[0]


def package_stub(name):
    """A package whose submodules load from the installed files, without
    running its __init__ (vllm's and sglang's pull in torch)."""
    m = types.ModuleType(name)
    m.__path__ = [os.path.join(SP, *name.split("."))]
    sys.modules[name] = m
    return m


def stand_in(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def functions_from(path, names, namespace):
    """Executes the named top-level functions of an installed source file in
    namespace (for modules that cannot be imported without torch)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = set(names) - {n.name for n in body}
    if missing:
        raise SystemExit(f"{path}: functions not found: {sorted(missing)}")
    code = compile(ast.Module(body=body, type_ignores=[]), path, "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)
    return namespace


# --- vLLM -------------------------------------------------------------------

for n in ["vllm", "vllm.distributed", "vllm.config", "vllm.utils", "vllm.v1", "vllm.v1.core"]:
    package_stub(n)


@dataclass
class KVEventsConfig:  # stand-in: vllm.config.kv_events imports torch
    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = ""
    replay_endpoint: Optional[str] = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""


stand_in("vllm.config.kv_events", KVEventsConfig=KVEventsConfig)
stand_in("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)

import vllm.distributed.kv_events as vkv  # noqa: E402  (the real module)
from vllm.utils.hashing import sha256_cbor  # noqa: E402

VLLM_UTILS = os.path.join(SP, "vllm/v1/core/kv_cache_utils.py")
venvs = types.SimpleNamespace(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=True)
vns = functions_from(
    VLLM_UTILS,
    [
        "maybe_convert_block_hash",
        "_gen_mm_extra_hash_keys",
        "_gen_lora_extra_hash_keys",
        "_gen_prompt_embeds_extra_hash_keys",
        "generate_block_hash_extra_keys",
        "to_event_extra_keys",
        "hash_block_tokens",
    ],
    {"envs": venvs, "BlockHash": bytes, "Any": Any, "Callable": Any, "Sequence": Any,
     "Iterable": Any, "NONE_HASH": sha256_cbor("vllm-none-hash")},
)


@dataclass
class MMPosition:
    offset: int
    length: int


@dataclass
class MMFeature:
    identifier: str
    mm_position: MMPosition


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str

    @property
    def name(self):
        return self.lora_name

    @property
    def adapter_id(self):
        return self.lora_int_id


@dataclass
class VRequest:
    """The fields of vllm.v1.request.Request that block hashing reads."""
    all_token_ids: list
    mm_features: list = field(default_factory=list)
    lora_request: Optional[LoRARequest] = None
    cache_salt: Optional[str] = None
    prompt_embeds: Any = None
    session_id: Optional[str] = None


def vllm_store(req, start_block, n_blocks, block_size, parent=None, medium="GPU",
               group_idx=0, kinds=(("full_attention", None),), int_hashes=True):
    """A BlockStored as BlockPool.cache_full_blocks builds it (hashes chained
    with hash_block_tokens, extra keys per block, converted for events),
    annotated with its group's kind as KVCacheManager.take_events does.
    Returns the event and the last raw block hash."""
    venvs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = int_hashes
    hashes, keys, mm_idx = [], [], 0
    prev = parent
    for i in range(start_block, start_block + n_blocks):
        s, e = i * block_size, (i + 1) * block_size
        extra, mm_idx = vns["generate_block_hash_extra_keys"](req, s, e, mm_idx)
        prev = vns["hash_block_tokens"](sha256_cbor, prev, req.all_token_ids[s:e], extra)
        hashes.append(vns["maybe_convert_block_hash"](prev))
        keys.append(extra)
    ev = vkv.BlockStored(
        block_hashes=hashes,
        parent_block_hash=vns["maybe_convert_block_hash"](parent) if parent is not None else None,
        token_ids=req.all_token_ids[start_block * block_size:(start_block + n_blocks) * block_size],
        block_size=block_size,
        lora_id=req.lora_request.adapter_id if req.lora_request else None,
        medium=medium,
        lora_name=req.lora_request.name if req.lora_request else None,
        extra_keys=vns["to_event_extra_keys"](keys),
        group_idx=group_idx,
        session_id=req.session_id,
    )
    kind, window = kinds[group_idx]
    ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window = kind, window
    return ev, prev


def vllm_removed(raw_hashes, medium="GPU", group_idx=0, int_hashes=True):
    venvs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = int_hashes
    return vkv.BlockRemoved(block_hashes=[vns["maybe_convert_block_hash"](h) for h in raw_hashes],
                            medium=medium, group_idx=group_idx)


def tokens(n, base):
    return [(base + 7919 * i) % 151936 for i in range(n)]


def vllm_scenarios():
    """(name, dp rank, events, description) for vLLM 0.33.0."""
    out = []
    bs = 16
    r = VRequest(all_token_ids=tokens(64, 1000), session_id="session-1")
    a, last_a = vllm_store(r, 0, 2, bs)
    b, last_b = vllm_store(r, 2, 2, bs, parent=last_a)
    rm = vllm_removed([last_b])
    out.append(("vllm033_int_hashes_dp0", 0, [a, b, rm, vkv.AllBlocksCleared()],
                "integer hashes: root store, child store, remove, clear; group 0 full attention"))
    r = VRequest(all_token_ids=tokens(48, 2000))
    a, last = vllm_store(r, 0, 3, bs, int_hashes=False)
    rm = vllm_removed([last], int_hashes=False)
    out.append(("vllm033_bytes_hashes_dp0", 0, [a, rm],
                "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: 32-byte SHA-256 block hashes"))
    r = VRequest(all_token_ids=tokens(32, 3000), lora_request=LoRARequest("adapter-a", 7, "/adapters/a"))
    a, _ = vllm_store(r, 0, 2, bs)
    out.append(("vllm033_lora_dp0", 0, [a], "LoRA request: lora_id, lora_name and the name in every block's extra keys"))
    r = VRequest(all_token_ids=tokens(48, 1000), cache_salt="tenant-a")
    a, last = vllm_store(r, 0, 2, bs)
    b, _ = vllm_store(r, 2, 1, bs, parent=last)
    out.append(("vllm033_salt_dp0", 0, [a, b],
                "cache_salt: in the first block's extra keys only; the child store carries none"))
    img = hashlib.sha256(b"image-a").hexdigest()
    img2 = hashlib.sha256(b"image-b").hexdigest()
    toks = tokens(64, 4000)
    toks[5:25] = [151655] * 20
    toks[30:40] = [151655] * 10
    r = VRequest(all_token_ids=toks, mm_features=[MMFeature(img, MMPosition(5, 20)), MMFeature(img2, MMPosition(30, 10))])
    a, _ = vllm_store(r, 0, 4, bs)
    out.append(("vllm033_multimodal_dp0", 0, [a],
                "two images: (identifier, offset) pairs in the extra keys of every block they overlap"))
    r = VRequest(all_token_ids=tokens(32, 5000))
    a, last = vllm_store(r, 0, 2, bs, medium="CPU")
    rm = vllm_removed([last], medium="CPU")
    out.append(("vllm033_cpu_offload_dp0", 0, [a, rm], "CPU offload medium: store and eviction on CPU"))
    kinds = (("full_attention", None), ("sliding_window", 32))
    r = VRequest(all_token_ids=tokens(96, 6000))
    g0, _ = vllm_store(r, 0, 6, bs, group_idx=0, kinds=kinds)
    g1, _ = vllm_store(r, 0, 6, bs, group_idx=1, kinds=kinds)
    rm1 = vkv.BlockRemoved(block_hashes=g1.block_hashes[:3], medium="GPU", group_idx=1)
    out.append(("vllm033_hybrid_groups_dp0", 0, [g0, g1, rm1],
                "hybrid model: both groups store the same hashes; the sliding-window group evicts 3 blocks (group_idx only)"))
    for rank in (1, 2):
        r = VRequest(all_token_ids=tokens(32, 7000 + rank))
        a, _ = vllm_store(r, 0, 2, bs)
        out.append((f"vllm033_dp{rank}", rank, [a], f"data-parallel rank {rank}: its own publisher on port + {rank}"))
    return out


# --- SGLang -----------------------------------------------------------------

for n in ["sglang", "sglang.srt", "sglang.srt.disaggregation", "sglang.srt.mem_cache", "sglang.srt.utils"]:
    package_stub(n)


def hash_str_to_int64(hash_str):
    # Copy of sglang.srt.mem_cache.utils.hash_str_to_int64 (that module
    # imports torch kernels).
    v = int(hash_str[:16], 16)
    return v - 2**64 if v >= 2**63 else v


def page_hashes(key, prior, page_size):
    """Stand-in for SGLang's native page hash (a torch C++ extension): a
    SHA-256 chain over each page's tokens, as hex strings."""
    out = []
    units = list(key)
    for s in range(0, len(units), page_size):
        h = hashlib.sha256((prior or "").encode() + repr(units[s:s + page_size]).encode()).hexdigest()
        out.append(h)
        prior = h
    return out


def compute_node_hash_values(node, page_size):
    prior = node.parent.hash_value[-1] if node.parent is not None and node.parent.hash_value else None
    if prior is None and (node.key.extra_key or node.key.cache_salt):
        prior = hashlib.sha256(f"{node.key.extra_key}|{node.key.cache_salt}".encode()).hexdigest()
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
    """Stand-in for sglang.srt.mem_cache.radix_cache.RadixKey (imports
    torch): raw token ids, a bigram view when is_bigram."""

    def __init__(self, token_ids, extra_key=None, cache_salt=None, is_bigram=False):
        self.token_ids = array("q", token_ids)
        self.extra_key, self.cache_salt, self.is_bigram = extra_key, cache_salt or None, is_bigram

    def __len__(self):
        n = len(self.token_ids)
        return max(n - 1, 0) if self.is_bigram else n

    def __iter__(self):
        t = self.token_ids
        if self.is_bigram:
            return iter([(t[i], t[i + 1]) for i in range(len(t) - 1)])
        return iter(t)


class Node:
    """Stand-in for a radix-tree node: the attributes the recorder reads."""

    def __init__(self, key, parent):
        self.key, self.parent = key, parent
        self.hash_value = None
        self.event_hash_value = None


def sglang_chain(recorder, root, chunks, **key_args):
    """Inserts token chunks as a chain of nodes under root, recording a store
    for each, and returns the nodes."""
    nodes, parent = [], root
    for chunk in chunks:
        n = Node(Key(chunk, **key_args), parent)
        recorder.record_store(n)
        nodes.append(n)
        parent = n
    return nodes


def sglang_scenarios():
    out = []

    def root():
        r = Node(Key([]), None)
        r.hash_value = []
        return r

    rec = sev.KVCacheEventRecorder(enabled=True, page_size=1)
    nodes = sglang_chain(rec, root(), [tokens(6, 100), tokens(4, 200)])
    rec.record_remove(nodes[1])
    rec.record_all_cleared()
    out.append(("sglang0523_page1_dp3", 3, rec.take(),
                "default format, page size 1 (SGLang's default): one-token blocks coalesced per node, remove, clear"))

    rec = sev.KVCacheEventRecorder(enabled=True, page_size=4)
    sglang_chain(rec, root(), [tokens(8, 300), tokens(9, 400)])
    out.append(("sglang0523_page4_dp0", 0, rec.take(), "default format, page size 4: a partial last page"))

    for ps in (1, 4):
        rec = sev.KVCacheEventRecorder(enabled=True, page_size=ps)
        sglang_chain(rec, root(), [tokens(9, 500)], is_bigram=True)
        out.append((f"sglang0523_eagle_page{ps}_dp0", 0, rec.take(),
                    f"Eagle: bigram keys publish [t, t+1] token pairs, page size {ps}"))

    rec = sev.KVCacheEventRecorder(enabled=True, page_size=4)
    sglang_chain(rec, root(), [tokens(8, 600)], cache_salt="tenant-a")
    out.append(("sglang0523_salt_dp0", 0, rec.take(), "default format: cache_salt on the store"))

    names = sev.KvEventLoraNames()
    lora_id = "0123456789abcdef0123456789abcdef"
    names.register(lora_id=lora_id, lora_name="adapter-a")
    rec = sev.KVCacheEventRecorder(enabled=True, page_size=4, dynamo_format=True, lora_names=names)
    nodes = sglang_chain(rec, root(), [tokens(8, 700)], extra_key=lora_id, cache_salt="tenant-a")
    rec.record_remove(nodes[0])
    out.append(("sglang0523_dynamo_format_dp0", 0, rec.take(),
                "format=dynamo: namespaced hashes, lora_name and cache_salt"))
    return out


# --- capture ----------------------------------------------------------------

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
    for rank in (1, 2, 3):
        sub.bind(f"tcp://127.0.0.1:{base + rank}")
    replay_port = base + 10
    publishers = {}

    def publisher(engine, rank):
        key = (engine, rank)
        if key not in publishers:
            cls = vkv.ZmqEventPublisher if engine == "vllm" else skv.ZmqEventPublisher
            kw = dict(endpoint=f"tcp://127.0.0.1:{base}", topic="kv-events")
            if engine == "vllm":
                # vLLM connects to this script's SUB socket (bound on the
                # base port + rank) and binds its replay ROUTER.
                kw["replay_endpoint"] = f"tcp://127.0.0.1:{replay_port}"
                publishers[key] = cls(data_parallel_rank=rank, **kw)
            else:
                # SGLang binds (its bind=True option) on its own base port
                # + rank; the SUB socket connects to it.
                kw["endpoint"] = f"tcp://127.0.0.1:{base + 20}"
                publishers[key] = cls(attn_dp_rank=rank, bind=True, **kw)
                sub.connect(f"tcp://127.0.0.1:{base + 20 + rank}")
            time.sleep(2)  # let the connection and subscription settle
        return publishers[key]

    written = []
    for engine, scenarios in (("vllm", vllm_scenarios()), ("sglang", sglang_scenarios())):
        for name, rank, events, description in scenarios:
            pub = publisher(engine, rank)
            if engine == "vllm":
                batch = vkv.KVEventBatch(ts=time.time(), events=events)
            else:
                batch = skv.KVEventBatch(ts=time.time(), events=events)
            for attempt in range(3):
                # A first message can be lost while a connection settles
                # on a loaded machine: publish again.
                pub.publish(batch)
                try:
                    topic, seq, payload = sub.recv_multipart()
                    break
                except zmq.Again:
                    if attempt == 2:
                        raise
            decoded = msgspec.msgpack.decode(payload)
            with open(os.path.join(outdir, name + ".msgpack"), "wb") as f:
                f.write(payload)
            meta = {
                "producer": {"vllm": "vllm 0.33.0 ZmqEventPublisher", "sglang": "sglang 0.5.23 ZmqEventPublisher + KVCacheEventRecorder"}[engine],
                "description": description,
                "topic": topic.decode(),
                "seq": int.from_bytes(seq, "big"),
                "batch": jsonable(decoded),
            }
            with open(os.path.join(outdir, name + ".json"), "w") as f:
                json.dump(meta, f, indent=1)
                f.write("\n")
            written.append(name)
            if engine == "vllm" and name == "vllm033_int_hashes_dp0":
                check_replay(ctx, replay_port, int.from_bytes(seq, "big"), payload)
    for p in publishers.values():
        p.shutdown()
    print("captured:", ", ".join(written))


def check_replay(ctx, port, seq, payload):
    """Asks vLLM's replay socket for seq and checks it returns the payload."""
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.RCVTIMEO, 5000)
    d.connect(f"tcp://127.0.0.1:{port}")
    d.send_multipart([b"", seq.to_bytes(8, "big")])
    frames = d.recv_multipart()  # [b"", topic, seq, payload] in vLLM 0.33
    assert frames[-2] == seq.to_bytes(8, "big") and frames[-1] == payload, "replay mismatch"
    print("replay reply frames:", len(frames))
    while frames[-2] != (-1).to_bytes(8, "big", signed=True):
        frames = d.recv_multipart()
    d.close(linger=0)
    print("replay socket returned batch", seq)


# --- Dynamo -----------------------------------------------------------------

DYNAMO_PUBLISHER = r"""
import asyncio, sys
from dynamo._core import DistributedRuntime, KvEventPublisher

async def main():
    loop = asyncio.get_running_loop()
    rt = DistributedRuntime(loop, "mem", "tcp", event_plane="zmq")
    pub = KvEventPublisher(rt.endpoint("kvroute.capture.generate"), worker_id=7, kv_block_size=4, dp_rank=0)
    await loop.run_in_executor(None, sys.stdin.readline)
    # A salted root store, an Eagle child (windows of 5 tokens) and a removal.
    pub.publish_stored(list(range(100, 108)), [4, 4], [11, 12], parent_hash=None, cache_salt="tenant-a")
    pub.publish_stored(list(range(108, 113)), [4], [13], parent_hash=12, is_eagle=True)
    pub.publish_stored([200, 201, 202, 203], [4], [21], parent_hash=None, lora_name="adapter-a",
                       block_mm_infos=[{"mm_objects": [{"mm_hash": 81985529216486895, "offsets": [[1, 3]]}]}])
    pub.publish_removed([13])
    await asyncio.sleep(2)
    pub.shutdown()
    rt.shutdown()

asyncio.run(main())
"""


def capture_dynamo(outdir):
    import re
    import subprocess

    env = dict(os.environ, DYN_LOG="info", DYN_EVENT_PLANE_HOST="127.0.0.1", NO_COLOR="1")
    child = subprocess.Popen([sys.executable, "-c", DYNAMO_PUBLISHER], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    port = None
    for line in child.stderr:
        m = re.search(r"ZMQ PUB transport bound.*endpoint=\S*tcp://[^:]+:(\d+)", re.sub(r"\x1b\[[0-9;]*m", "", line))
        if m:
            port = int(m.group(1))
            break
    if port is None:
        raise SystemExit("Dynamo's publisher did not report its port")
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.connect(f"tcp://127.0.0.1:{port}")
    time.sleep(1)
    child.stdin.write("go\n")
    child.stdin.flush()
    messages = []
    try:
        while len(messages) < 4:
            messages.append(sub.recv_multipart())
    except zmq.Again:
        pass
    child.stdin.close()
    child.wait(timeout=30)
    names = ["dynamo161_stored_salt", "dynamo161_stored_eagle", "dynamo161_stored_lora_mm", "dynamo161_removed"]
    for name, (topic, publisher, seq, envelope) in zip(names, messages):
        version, size = envelope[0], int.from_bytes(envelope[1:5], "big")
        env_map = msgspec.msgpack.decode(envelope[5:5 + size])
        payload = env_map.pop("payload")
        with open(os.path.join(outdir, name + ".msgpack"), "wb") as f:
            f.write(payload)
        meta = {
            "producer": "ai-dynamo-runtime 1.6.1 KvEventPublisher (ZMQ event plane)",
            "topic": topic.decode(),
            "publisher_id": int.from_bytes(publisher, "big"),
            "seq": int.from_bytes(seq, "big"),
            "envelope_version": version,
            "envelope": jsonable(env_map),
            "router_events": jsonable(msgspec.msgpack.decode(payload)),
        }
        with open(os.path.join(outdir, name + ".json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
    print("captured:", ", ".join(names[:len(messages)]))


if __name__ == "__main__":
    # capture.py [OUTDIR] [vllm-sglang|dynamo|all]
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    which = sys.argv[2] if len(sys.argv) > 2 else "all"
    if which in ("all", "vllm-sglang"):
        capture(out)
    if which in ("all", "dynamo"):
        capture_dynamo(out)
