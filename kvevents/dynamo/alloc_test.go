package dynamo_test

import (
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/dynamo"
)

// TestDecodeAllocatesNothing: once its buffers have grown, the decode path
// of every topic allocates nothing per message.
func TestDecodeAllocatesNothing(t *testing.T) {
	for _, g := range readGolden(t) {
		var m dynamo.Message
		var devs []kvevents.DynamoEvent
		var ev kvroute.Event
		var al dynamo.ActiveLoad
		var fpm dynamo.ForwardPassMetrics
		decode := func() {
			if err := dynamo.DecodeZMQ(g.frames, &m); err != nil {
				t.Fatal(err)
			}
			var err error
			switch m.Topic {
			case dynamo.TopicKVEvents:
				devs, err = dynamo.DecodeRouterEvents(devs[:0], m.Envelope.Payload)
				for i := range devs {
					if err == nil {
						err = devs[i].ToEvent(&ev)
					}
				}
			case dynamo.TopicKVMetrics:
				err = dynamo.DecodeActiveLoad(m.Envelope.Payload, &al)
			case dynamo.TopicForwardPassMetrics:
				err = dynamo.DecodeForwardPassMetrics(m.Envelope.Payload, &fpm)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		decode() // grow the buffers
		if n := testing.AllocsPerRun(100, decode); n != 0 {
			t.Errorf("%s: %v allocations per message", g.name, n)
		}
	}
}
