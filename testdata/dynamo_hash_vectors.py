#!/usr/bin/env python3
"""Writes dynamo_hash_vectors.json: block hashes computed by NVIDIA Dynamo's
own compute_block_hash_for_seq (ai-dynamo-runtime 1.6.1, the Python binding
of the dynamo-kv-router crate), for kvroute's hasher tests.

Not run by the tests or CI. To regenerate:

    python3 -m venv /tmp/dynvec
    /tmp/dynvec/bin/pip install --no-deps ai-dynamo-runtime==1.6.1
    /tmp/dynvec/bin/python testdata/dynamo_hash_vectors.py > testdata/dynamo_hash_vectors.json

Each vector gives the hasher inputs (tokens, block size, LoRA name, cache
namespace, Eagle flag, multimodal objects as hash/offset/length) and the
block hashes Dynamo computes. Multimodal objects are assigned to blocks as
vLLM assigns its extra keys: an object belongs to every block whose tokens
[i*block_size, (i+1)*block_size) overlap its placeholder range, and
the same image given twice counts twice in a block both overlap, as vLLM's
extra keys list it.
"""

import json
import random

from dynamo._core import compute_block_hash_for_seq


def block_mm_infos(n_tokens, block_size, eagle, objects):
    if not objects:
        return None
    n = ((n_tokens - 1) if eagle else n_tokens) // block_size
    infos = []
    for i in range(n):
        start, end = i * block_size, (i + 1) * block_size
        objs = [
            {"mm_hash": o["hash"], "offsets": [[o["offset"], o["offset"] + o["length"]]]}
            for o in objects
            if o["offset"] < end and start < o["offset"] + o["length"]
        ]
        infos.append({"mm_objects": objs} if objs else None)
    return infos


def vector(name, tokens, block_size, lora=None, namespace=None, eagle=False, mm=None):
    hashes = compute_block_hash_for_seq(
        tokens,
        block_size,
        block_mm_infos=block_mm_infos(len(tokens), block_size, eagle, mm),
        lora_name=lora,
        is_eagle=eagle,
        cache_namespace=namespace,
    )
    return {
        "name": name,
        "tokens": tokens,
        "block_size": block_size,
        "lora": lora or "",
        "namespace": namespace or "",
        "eagle": eagle,
        "mm": mm or [],
        "block_hashes": hashes,
    }


def main():
    rng = random.Random(14)
    text = [rng.randrange(151936) for _ in range(70)]
    long_text = [rng.randrange(1 << 32) for _ in range(300)]
    image_pad = 151655
    # A prompt with two images of 20 placeholder tokens each.
    mm_prompt = text[:10] + [image_pad] * 20 + text[10:15] + [image_pad] * 20 + text[15:30]
    img_a = 0x0123456789ABCDEF
    img_b = 0xFEDCBA9876543210
    img_c = 0x1122334455667788
    vectors = [
        vector("base", list(range(8)), 4),
        vector("base-bs16", text[:64], 16),
        vector("partial-last-block", text[:70], 16),
        vector("lora", text[:64], 16, lora="adapter-a"),
        vector("salt", text[:64], 16, namespace="tenant-a"),
        vector("salt-other", text[:64], 16, namespace="tenant-b"),
        vector("lora-and-salt", text[:64], 16, lora="adapter-a", namespace="tenant-a"),
        vector("eagle", list(range(13)), 4, eagle=True),
        vector("eagle-bs16-exact", text[:64], 16, eagle=True),
        vector("eagle-bs16", text[:65], 16, eagle=True),
        vector("eagle-salt-lora", text[:65], 16, lora="adapter-b", namespace="tenant-a", eagle=True),
        vector("mm-two-images", mm_prompt, 16,
               mm=[{"hash": img_a, "offset": 10, "length": 20}, {"hash": img_b, "offset": 35, "length": 20}]),
        vector("mm-other-image", mm_prompt, 16,
               mm=[{"hash": img_c, "offset": 10, "length": 20}, {"hash": img_b, "offset": 35, "length": 20}]),
        vector("mm-unsorted-in-block", mm_prompt, 16,
               mm=[{"hash": img_b, "offset": 10, "length": 20}, {"hash": img_a, "offset": 30, "length": 25}]),
        vector("mm-salt-lora", mm_prompt, 16, lora="adapter-a", namespace="tenant-a",
               mm=[{"hash": img_a, "offset": 10, "length": 20}]),
        vector("mm-eagle", mm_prompt + [7], 16, eagle=True,
               mm=[{"hash": img_a, "offset": 10, "length": 20}, {"hash": img_b, "offset": 35, "length": 20}]),
        vector("bs1", text[:5], 1),
        vector("eagle-bs1", list(range(6)), 1, eagle=True),
        vector("bs7-unicode-lora", text[:30], 7, lora="adaptér-ü"),
        vector("bs64-full-range-tokens", long_text[:200], 64),
        vector("bs16-long-unicode-salt", long_text, 16, namespace="tenant-ü"),
        vector("mm-ten-items-in-one-block", text[:40], 16,
               mm=[{"hash": (img_a * (i + 1)) % (1 << 64), "offset": i, "length": 1} for i in range(10)]),
        vector("mm-same-image-twice-in-a-block", text[:32], 16,
               mm=[{"hash": img_a, "offset": 2, "length": 4}, {"hash": img_a, "offset": 8, "length": 4}]),
        vector("mm-item-spans-every-block", text[:64], 16, mm=[{"hash": img_c, "offset": 5, "length": 50}]),
        vector("mm-item-past-the-end", text[:70], 16, mm=[{"hash": img_b, "offset": 60, "length": 100}]),
        vector("mm-item-ends-at-a-block-start", text[:48], 16, mm=[{"hash": img_b, "offset": 4, "length": 12}]),
    ]
    json.dump({"producer": "ai-dynamo-runtime 1.6.1 dynamo._core.compute_block_hash_for_seq",
               "vectors": vectors}, fp=__import__("sys").stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
