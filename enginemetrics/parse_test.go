package enginemetrics_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/enginemetrics"
)

const vllmText = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27910"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0
`

const sglangText = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="0"} 7.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="0"} 4.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="0"} 0.83
`

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		text string
		kind enginemetrics.Kind
		want enginemetrics.Metrics
		err  string
	}{
		{name: "vllm data parallel", text: vllmText, kind: enginemetrics.KindAuto, want: enginemetrics.Metrics{
			Kind: enginemetrics.KindVLLM, BlockSize: 16, GPUBlocks: 27910,
			Ranks: []enginemetrics.Rank{{Running: 3, Waiting: 0, KVUsage: 0.25}, {Running: 5, Waiting: 2, KVUsage: 0.5}},
		}},
		{name: "sglang", text: sglangText, kind: enginemetrics.KindSGLang, want: enginemetrics.Metrics{
			Kind: enginemetrics.KindSGLang, Ranks: []enginemetrics.Rank{{Running: 7, Waiting: 4, KVUsage: 0.83}},
		}},
		{name: "older vllm name, no rank label", kind: enginemetrics.KindVLLM,
			text: "vllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_running 2\n",
			want: enginemetrics.Metrics{Kind: enginemetrics.KindVLLM, Ranks: []enginemetrics.Rank{{Running: 2, KVUsage: 0.5}}}},
		{name: "clamped", kind: enginemetrics.KindAuto,
			text: "vllm:kv_cache_usage_perc 7\nvllm:num_requests_waiting -3\nvllm:num_requests_running NaN\n",
			want: enginemetrics.Metrics{Kind: enginemetrics.KindVLLM, Ranks: []enginemetrics.Rank{{KVUsage: 1}}}},
		{name: "wrong kind", text: sglangText, kind: enginemetrics.KindVLLM, err: "no vllm load metrics"},
		{name: "not metrics", text: "<html>hello</html>\n", kind: enginemetrics.KindAuto, err: "unreadable"},
		{name: "empty", text: "", kind: enginemetrics.KindAuto, err: "no auto load metrics"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := enginemetrics.Parse(strings.NewReader(tt.text), tt.kind)
			if tt.err != "" {
				require.ErrorIs(t, err, enginemetrics.ErrMetrics)
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, m)
		})
	}
}

func TestLoad(t *testing.T) {
	m, err := enginemetrics.Parse(strings.NewReader(vllmText), enginemetrics.KindAuto)
	require.NoError(t, err)
	l := m.Load(1)
	require.Equal(t, 5, l.ActiveRequests)
	require.Equal(t, 2, l.QueueDepth)
	require.Equal(t, 0.5, l.KVUtilization)
	require.Equal(t, 27910, l.KVCapacityBlocks)
	require.Zero(t, m.Load(9).ActiveRequests)
}

// FuzzParse: any text parses or fails with ErrMetrics, never panics, and
// gives loads in range.
func FuzzParse(f *testing.F) {
	f.Add(vllmText)
	f.Add(sglangText)
	f.Add(`vllm:num_requests_running{engine="4095"} 1e300` + "\n")
	f.Add(`vllm:cache_config_info{block_size="-1",num_gpu_blocks="x"} 1` + "\n")
	f.Fuzz(func(t *testing.T, text string) {
		m, err := enginemetrics.Parse(strings.NewReader(text), enginemetrics.KindAuto)
		if err != nil {
			require.ErrorIs(t, err, enginemetrics.ErrMetrics)
			return
		}
		require.NotEmpty(t, m.Ranks)
		require.GreaterOrEqual(t, m.BlockSize, 0)
		for _, r := range m.Ranks {
			require.GreaterOrEqual(t, r.Running, 0)
			require.GreaterOrEqual(t, r.Waiting, 0)
			require.True(t, r.KVUsage >= 0 && r.KVUsage <= 1)
		}
	})
}
