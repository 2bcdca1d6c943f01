package zmq_test

import (
	"context"
	"fmt"

	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
	kvzmq "github.com/kvroute/kvroute/kvevents/zmq"
)

// Wire a subscriber for one engine into an index. Run returns when its
// context ends (here at once, so the example does not wait for an engine).
func Example() {
	index, err := indexer.New(indexer.Config{})
	if err != nil {
		panic(err)
	}
	sub, err := kvzmq.New(kvzmq.Config{
		Endpoint:       "tcp://127.0.0.1:5557",
		ReplayEndpoint: "tcp://127.0.0.1:5558",
		Topic:          "kv-events",
		Converter:      kvevents.ConverterConfig{Worker: 7, BlockSize: 16},
		Sink:           index,
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	fmt.Println(sub.Run(ctx))
	st := sub.Stats()
	fmt.Println(st.Received, st.Applied, st.Malformed, st.Convert.SkippedGroupEvents)
	// Output:
	// <nil>
	// 0 0 0 0
}
