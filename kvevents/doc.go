// Package kvevents decodes and encodes the KV-cache events of vLLM, SGLang
// and NVIDIA Dynamo and converts them into kvroute.Event.
//
// It is the codec only: it does no I/O and imports no transport. The ZMQ
// subscriber lives in kvevents/zmq and the NATS transport in
// kvevents/natsx.
//
// # Usage
//
// A host that receives engine payloads itself (any transport) does this,
// on one goroutine per engine connection:
//
//  1. Create one [Converter] per engine with its worker id, block size and
//     hasher namespace ([ConverterConfig]); keep one [Batch] and one
//     []kvroute.Event to reuse.
//  2. For each payload (the third frame of a vLLM/SGLang ZMQ message),
//     call [DecodeBatch], then [Converter.Convert].
//  3. Number the events per worker (or leave ID 0) and apply them to the
//     indexer in order.
//
// In code:
//
//	conv, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 7, BlockSize: 16})
//	if err != nil {
//		return err
//	}
//	var batch kvevents.Batch
//	var evs []kvroute.Event
//	for payload := range payloads {
//		if err := kvevents.DecodeBatch(payload, &batch); err != nil {
//			continue // malformed: count it
//		}
//		if evs, err = conv.Convert(evs[:0], &batch); err != nil {
//			continue
//		}
//		for i := range evs {
//			_ = index.Apply(&evs[i])
//		}
//	}
//
// # Wire formats
//
// vLLM and SGLang publish msgspec-encoded batches: [timestamp, events] or
// [timestamp, events, data-parallel rank]. Events are arrays whose first
// element is the tag ("BlockStored", "BlockRemoved", "AllBlocksCleared"),
// or, from vllm-project/vllm#42892 on, maps with a "type" key.
// [DecodeBatch] accepts all of them, the fields of [EngineEvent] (including
// the {"cache_salt": ...} map SGLang 0.5.18 and 0.5.19 append to salted
// array stores), shorter arrays from older producers and unknown trailing
// fields or keys from newer ones. [AppendBatch] writes a batch back so
// that it decodes to the same value. vLLM's batches come back byte for
// byte; others need not, as AppendBatch writes vLLM's key order and the
// smallest headers and drops unknown keys and fields (see AppendBatch).
// Block hashes stay opaque: see [Hash] for how a hash sent as a byte
// string becomes the 64-bit kvroute.ExternalHash.
//
// Dynamo's RouterEvent ([DynamoEvent]) is read and written as JSON
// (serde_json) and as named msgpack (rmp_serde) with [DecodeDynamoEvent]
// and [AppendDynamoEvent].
//
// # Conversion
//
// [Converter] computes each stored block's kvroute.BlockHash from the
// event's token ids exactly as the router hashes a request (Dynamo's XXH3
// block hash): with the router's block size, the LoRA adapter (lora_name,
// or lora_id through a host table), the cache salt (SGLang's cache_salt,
// vLLM's extra_keys, inherited along a chain), the multimodal items of
// vLLM's extra_keys ([ParseExtraKeys]) or of the block_mm_infos that
// Dynamo's TensorRT-LLM publisher sends ([ParseBlockMMInfos]) and SGLang's
// Eagle token pairs. It
// maps the medium to a tier ([TierOfMedium]), drops a partial last block,
// keeps only the KV-cache groups that decide prefix reuse in hybrid models
// ([ConverterConfig.ReuseKinds]), gives batches without a rank the
// subscriber's rank, re-chunks or rejects events of another block size
// (SGLang's page size 1), and stores the copies of device blocks that
// vLLM's CPU offloading reports without tokens from what the device stores
// said of those blocks. What it leaves out is counted ([ConvertStats]).
//
// Decoders never panic on their input, and allocate in proportion to it;
// they are fuzzed with the golden files under testdata.
package kvevents
