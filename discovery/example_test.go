package discovery_test

import (
	"fmt"

	"github.com/kvroute/kvroute/discovery"
)

func ExampleParseEngine() {
	e, err := discovery.ParseEngine("vllm-0=10.0.0.7:8000,ports=8000+8001,events=tcp://10.0.0.7:5557,metrics=http://10.0.0.7:8000/metrics")
	if err != nil {
		panic(err)
	}
	for r := range e.Ports {
		ev, _ := discovery.RankEndpoint(e.Events, r)
		fmt.Println(r, e.Address(r), ev)
	}
	// Output:
	// 0 10.0.0.7:8000 tcp://10.0.0.7:5557
	// 1 10.0.0.7:8001 tcp://10.0.0.7:5558
}
