package dynamo_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/dynamo"
)

// kvEventsFrames returns a kv-events message of n stored events of 4
// blocks each, chained, as Dynamo frames it.
func kvEventsFrames(b *testing.B, n int) [][]byte {
	evs := make([]kvevents.DynamoEvent, n)
	parent := uint64(0)
	for i := range evs {
		d := kvevents.DynamoEvent{WorkerID: 6285901146321541251, EventID: uint64(i), Kind: kvevents.DynamoStored,
			StorageTier: kvevents.DynamoTierDevice, ResidencyDomain: "worker", HasParent: parent != 0, ParentHash: parent}
		for j := range 4 {
			h := uint64(1e12) + uint64(4*i+j)*0x9e3779b97f4a7c15
			d.Blocks = append(d.Blocks, kvevents.DynamoBlock{BlockHash: h, TokensHash: h ^ 0xff})
			parent = h
		}
		evs[i] = d
	}
	p, err := dynamo.AppendRouterEvents(nil, evs)
	require.NoError(b, err)
	return dynamo.AppendZMQ(&dynamo.Envelope{Topic: dynamo.TopicKVEvents, PublisherID: 1, Sequence: 1, PublishedAt: 1, Payload: p})
}

// BenchmarkDecodeKVEvents measures the decode path of a kv-events message:
// frames, envelope, RouterEvents and their conversion to kvroute.Event,
// for messages of 1, 8 and 64 events of 4 blocks.
func BenchmarkDecodeKVEvents(b *testing.B) {
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			frames := kvEventsFrames(b, n)
			var m dynamo.Message
			var devs []kvevents.DynamoEvent
			var ev kvroute.Event
			b.ReportAllocs()
			b.SetBytes(int64(len(frames[3])))
			for b.Loop() {
				if err := dynamo.DecodeZMQ(frames, &m); err != nil {
					b.Fatal(err)
				}
				var err error
				if devs, err = dynamo.DecodeRouterEvents(devs[:0], m.Envelope.Payload); err != nil {
					b.Fatal(err)
				}
				for i := range devs {
					if err := devs[i].ToEvent(&ev); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n*4), "ns/block")
		})
	}
}

// BenchmarkDecodeLoad measures the decode path of the load topics, on
// messages captured from a live mocker.
func BenchmarkDecodeLoad(b *testing.B) {
	for _, name := range []string{"dynamo161_mocker_kv_metrics", "dynamo161_mocker_fpm_decode"} {
		var frames [][]byte
		for _, g := range readGolden(b) {
			if g.name == name {
				frames = g.frames
			}
		}
		require.NotNil(b, frames, name)
		b.Run(name, func(b *testing.B) {
			var m dynamo.Message
			var al dynamo.ActiveLoad
			var fpm dynamo.ForwardPassMetrics
			b.ReportAllocs()
			for b.Loop() {
				if err := dynamo.DecodeZMQ(frames, &m); err != nil {
					b.Fatal(err)
				}
				var err error
				if m.Topic == dynamo.TopicKVMetrics {
					err = dynamo.DecodeActiveLoad(m.Envelope.Payload, &al)
				} else {
					err = dynamo.DecodeForwardPassMetrics(m.Envelope.Payload, &fpm)
				}
				if err != nil {
					b.Fatal(err)
				}
				_ = dynamo.LoadOf(&al, &fpm, 800, 16)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/report")
		})
	}
}
