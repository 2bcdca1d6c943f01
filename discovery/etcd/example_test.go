package etcd_test

import (
	"fmt"

	"github.com/kvroute/kvroute/discovery/etcd"
)

func ExampleDecode() {
	// The value stored under /kvroute/pool-a/vllm-0.
	e, err := etcd.Decode("vllm-0", []byte(`{"host":"10.0.0.7","ports":[8000],"ready":true,
	  "events":"tcp://10.0.0.7:5557","metrics":"http://10.0.0.7:8000/metrics","kind":"vllm"}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(e.Name, e.Address(0), e.Events)
	// Output: vllm-0 10.0.0.7:8000 tcp://10.0.0.7:5557
}
