package enginemetrics_test

import (
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/enginemetrics"
)

func ExampleParse() {
	text := `vllm:num_requests_running{model_name="m"} 4
vllm:num_requests_waiting{model_name="m"} 1
vllm:kv_cache_usage_perc{model_name="m"} 0.42
vllm:cache_config_info{block_size="16",num_gpu_blocks="8000"} 1
`
	m, err := enginemetrics.Parse(strings.NewReader(text), enginemetrics.KindAuto)
	if err != nil {
		panic(err)
	}
	l := m.Load(0)
	fmt.Println(m.Kind, m.BlockSize, l.ActiveRequests, l.QueueDepth, l.KVUtilization, l.KVCapacityBlocks)
	// Output: vllm 16 4 1 0.42 8000
}
