// Package zmq subscribes to an inference engine's ZMQ KV-event stream
// (vLLM's and SGLang's framing) and applies it, gap-free, to an index.
//
// It uses github.com/go-zeromq/zmq4, a pure-Go ZMQ implementation, so it
// needs no C library.
//
// # Usage
//
// For each engine (each data-parallel rank of vLLM has its own publisher,
// on port+rank):
//
//  1. Build a [Config] with the engine's PUB endpoint, its replay endpoint
//     (vLLM's --kv-events-config replay_endpoint; optional but without it
//     every lost batch resets the worker), the topic, the worker id and
//     block size, and the sink (an *indexer.Index). With one subscriber per
//     data-parallel rank endpoint, set Converter.Rank to that rank, so that
//     batches that carry no rank land on it.
//  2. Call [New], then run [Subscriber.Run] on a goroutine of your own; it
//     returns when the context ends.
//  3. Read [Subscriber.Stats] for monitoring.
//
// In code:
//
//	sub, err := zmq.New(zmq.Config{
//		Endpoint:       "tcp://10.0.0.7:5557",
//		ReplayEndpoint: "tcp://10.0.0.7:5558",
//		Topic:          "kv-events",
//		Converter:      kvevents.ConverterConfig{Worker: 7, BlockSize: 16},
//		Sink:           index,
//	})
//	if err != nil {
//		return err
//	}
//	go sub.Run(ctx)
//
// # Wire protocol
//
// Each PUB message is [topic, 8-byte big-endian sequence number, payload];
// sequence numbers count from 0 per publisher. A replay request is
// [empty delimiter, 8-byte start sequence] on a DEALER connected to the
// engine's ROUTER; replies are [seq, payload] (after the delimiter,
// optionally after a topic frame) up to the end marker seq -1 with an
// empty payload. See [Subscriber] for how gaps, lost batches and restarts
// are handled.
package zmq
