package discovery_test

import (
	"context"
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

// printNames is a Sink that prints the engines it is given.
type printNames struct{}

func (printNames) Sync(_ context.Context, engines []discovery.Engine) {
	var names []string
	for _, e := range engines {
		names = append(names, e.Name)
	}
	fmt.Println(names)
}

// Static engines beside a watcher's: each source syncs its own part, and
// the pool (here a printer) gets the union.
func ExampleMerged() {
	m := discovery.NewMerged(printNames{}, 2)
	static, watched := m.Source(0), m.Source(1)
	ctx := context.Background()
	static.Sync(ctx, []discovery.Engine{{Name: "static-0"}})
	watched.Sync(ctx, []discovery.Engine{{Name: "pod-a"}, {Name: "pod-b"}})
	watched.Sync(ctx, []discovery.Engine{{Name: "pod-b"}})
	// Output:
	// [static-0]
	// [static-0 pod-a pod-b]
	// [static-0 pod-b]
}
