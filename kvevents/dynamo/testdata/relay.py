#!/usr/bin/env python3
"""Dynamo's own KV event relay and load publisher, for the live tests of
package kvevents/dynamo (live_test.go starts it; it is not run otherwise).

    relay.py VLLM_ENDPOINT BLOCK_SIZE

ai-dynamo-runtime's KvEventPublisher, in relay mode, subscribes to the
vLLM-format ZMQ endpoint VLLM_ENDPOINT (a PUB socket of the test), turns
each batch into RouterEvents (hashing the tokens itself) and publishes them
on Dynamo's ZMQ event plane; a WorkerMetricsPublisher publishes kv_metrics
on the same endpoint. The relay keeps a local indexer, served on Dynamo's
TCP request plane as the publisher's recovery target (v1/event_sources).
Both publishers name the worker by the runtime's connection id
(the instance id a served endpoint registers), which the relay prints as
"ready WORKER_ID" once both publishers are registered. Discovery is
Dynamo's file backend under $DYN_FILE_KV, where the test finds the event
channels.

The event plane is ZMQ, or NATS (at $NATS_SERVER) when $KVROUTE_EVENT_PLANE
is "nats".

Commands on stdin, one a line, each answered "ok" on stdout:
    load DP_RANK ACTIVE_DECODE_BLOCKS KV_USED_BLOCKS   publish kv_metrics
End of input stops the relay.
"""

import asyncio
import os
import sys

from dynamo._core import DistributedRuntime, KvEventPublisher, WorkerMetricsPublisher


async def main():
    vllm_endpoint, block_size = sys.argv[1], int(sys.argv[2])
    loop = asyncio.get_running_loop()
    rt = DistributedRuntime(loop, "file", "tcp", event_plane=os.environ.get("KVROUTE_EVENT_PLANE", "zmq"))
    endpoint = rt.endpoint("kvroute.relay.generate")
    # KVROUTE_DP_RANK: the data-parallel rank the relay publishes for, as a
    # worker of a multi-node deployment whose ranks do not start at 0.
    relay = KvEventPublisher(endpoint, kv_block_size=block_size, enable_local_indexer=True,
                             zmq_endpoint=vllm_endpoint, zmq_topic="",
                             dp_rank=int(os.environ.get("KVROUTE_DP_RANK", "0")))
    metrics = WorkerMetricsPublisher()
    await metrics.create_endpoint(endpoint)
    print("ready", endpoint.connection_id(), flush=True)
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        cmd = line.split()
        if cmd and cmd[0] == "load":
            metrics.publish(int(cmd[1]), int(cmd[2]), int(cmd[3]))
        print("ok", flush=True)
    relay.shutdown()
    rt.shutdown()


asyncio.run(main())
