package kvprom_test

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/kvprom"
	"github.com/kvroute/kvroute/kvevents/zmq"
)

func Example() {
	index, _ := indexer.New(indexer.Config{})
	sub, _ := zmq.New(zmq.Config{
		Endpoint:  "tcp://127.0.0.1:5557",
		Converter: kvevents.ConverterConfig{Worker: 7, BlockSize: 16},
		Sink:      index,
	})
	c := kvprom.New("kvroute")
	c.Add("engine-7", sub)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	// Serve it with promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).
	n, _ := testutil.GatherAndCount(reg, "kvroute_kvevents_batches_malformed_total")
	fmt.Println(n, "malformed-batch series")
	// Output: 1 malformed-batch series
}
