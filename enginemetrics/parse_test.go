package enginemetrics_test

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/router"
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
			Ranks: []enginemetrics.Rank{{Running: 3, Waiting: 0, KVUsage: 0.25, Reported: true}, {Running: 5, Waiting: 2, KVUsage: 0.5, Reported: true}},
		}},
		{name: "sglang", text: sglangText, kind: enginemetrics.KindSGLang, want: enginemetrics.Metrics{
			Kind: enginemetrics.KindSGLang, Ranks: []enginemetrics.Rank{{Running: 7, Waiting: 4, KVUsage: 0.83, Reported: true}},
		}},
		{name: "older vllm name, no rank label", kind: enginemetrics.KindVLLM,
			text: "vllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_running 2\n",
			want: enginemetrics.Metrics{Kind: enginemetrics.KindVLLM, Ranks: []enginemetrics.Rank{{Running: 2, KVUsage: 0.5, Reported: true}}}},
		{name: "clamped", kind: enginemetrics.KindAuto,
			text: "vllm:kv_cache_usage_perc 7\nvllm:num_requests_waiting -3\nvllm:num_requests_running NaN\n",
			want: enginemetrics.Metrics{Kind: enginemetrics.KindVLLM, Ranks: []enginemetrics.Rank{{KVUsage: 1, Reported: true}}}},
		{name: "sglang, one series per tensor-parallel scheduler", kind: enginemetrics.KindSGLang, text: sglangTP(4),
			want: enginemetrics.Metrics{Kind: enginemetrics.KindSGLang, Ranks: []enginemetrics.Rank{{Running: 7, Waiting: 4, KVUsage: 0.5, Reported: true}}}},
		{name: "two models add up", kind: enginemetrics.KindVLLM,
			text: "vllm:num_requests_running{model_name=\"a\"} 2\nvllm:num_requests_running{model_name=\"b\"} 3\n",
			want: enginemetrics.Metrics{Kind: enginemetrics.KindVLLM, Ranks: []enginemetrics.Rank{{Running: 5, Reported: true}}}},
		{name: "a rank without samples", kind: enginemetrics.KindVLLM,
			text: "vllm:num_requests_running{engine=\"1\"} 2\n",
			want: enginemetrics.Metrics{Kind: enginemetrics.KindVLLM, Ranks: []enginemetrics.Rank{{}, {Running: 2, Reported: true}}}},
		{name: "both engines' names: vLLM's", kind: enginemetrics.KindAuto,
			text: "sglang:num_running_reqs 1\nvllm:num_requests_running 5\n",
			want: enginemetrics.Metrics{Kind: enginemetrics.KindVLLM, Ranks: []enginemetrics.Rank{{Running: 5, Reported: true}}}},
		{name: "wrong kind", text: sglangText, kind: enginemetrics.KindVLLM, err: "no vllm load metrics"},
		{name: "not metrics", text: "<html>hello</html>\n", kind: enginemetrics.KindAuto, err: "unreadable"},
		{name: "empty", text: "", kind: enginemetrics.KindAuto, err: "no auto load metrics"},
		{name: "labels at the limit", kind: enginemetrics.KindAuto, text: manyLabels(enginemetrics.MaxLabels),
			want: enginemetrics.Metrics{Kind: enginemetrics.KindVLLM, Ranks: []enginemetrics.Rank{{Running: 1, Reported: true}}}},
		{name: "too many labels", text: "# HELP x a=b=c\n" + manyLabels(enginemetrics.MaxLabels+1), kind: enginemetrics.KindAuto,
			err: "line 2: more than 64 labels"},
		{name: "too many samples", text: strings.Repeat("vllm:num_requests_running 1\n", enginemetrics.MaxSamples+1),
			kind: enginemetrics.KindAuto, err: "line 131073: more than 131072 samples"},
		{name: "too long", text: "vllm:num_requests_running 1\n#" + strings.Repeat(" ", enginemetrics.MaxTextBytes), kind: enginemetrics.KindAuto,
			err: "longer than 8388608 bytes"},
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

// sglangTP is SGLang's load with --enable-metrics-for-all-schedulers and
// tp tensor-parallel ranks: each scheduler reports the same batch.
func sglangTP(tp int) string {
	var b strings.Builder
	for _, nv := range []string{"num_running_reqs 7", "num_queue_reqs 4", "token_usage 0.5"} {
		n, v, _ := strings.Cut(nv, " ")
		fmt.Fprintf(&b, "# TYPE sglang:%s gauge\n", n)
		for r := range tp {
			fmt.Fprintf(&b, "sglang:%s{engine_type=\"unified\",model_name=\"Qwen/Qwen3-8B\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"%d\"} %s\n", n, r, v)
		}
	}
	return b.String()
}

// Parse gives the same result whatever the order of a text's metrics.
func TestParseDeterministic(t *testing.T) {
	text := "sglang:num_running_reqs 1\nvllm:num_requests_running 5\nsglang:num_queue_reqs 2\nvllm:kv_cache_usage_perc 0.1\n"
	first, err := enginemetrics.Parse(strings.NewReader(text), enginemetrics.KindAuto)
	require.NoError(t, err)
	for range 100 {
		m, err := enginemetrics.Parse(strings.NewReader(text), enginemetrics.KindAuto)
		require.NoError(t, err)
		require.Equal(t, first, m)
	}
}

// manyLabels is one vLLM sample with n labels.
func manyLabels(n int) string {
	var b strings.Builder
	b.WriteString("vllm:num_requests_running{")
	for i := range n {
		fmt.Fprintf(&b, "l%d=\"v\",", i)
	}
	b.WriteString("} 1\n")
	return b.String()
}

// labelList is n labels made by format from 0 to n-1, comma-separated.
func labelList(n int, format string) string {
	l := make([]string, n)
	for i := range l {
		l[i] = fmt.Sprintf(format, i)
	}
	return strings.Join(l, ",")
}

// TestParseLongLabelLines: the labels of one line are bounded before the
// text parser sees them, whatever their quoting, and the rejection comes
// from the first line over the limit.
func TestParseLongLabelLines(t *testing.T) {
	for _, text := range []string{
		manyLabels(20000),
		"vllm:num_requests_running{" + labelList(50, `l%d="="`) + "} 1\n",
		`{"vllm:num_requests_running",` + labelList(40, `"a=%d"="1"`) + "} 1\n",
		"  \t" + manyLabels(500),
	} {
		_, err := enginemetrics.Parse(strings.NewReader(text), enginemetrics.KindAuto)
		require.ErrorIs(t, err, enginemetrics.ErrMetrics)
		require.ErrorContains(t, err, "line 1: more than 64 labels")
	}
	// Comment lines are not counted, nor are earlier lines' labels.
	text := "# HELP vllm:num_requests_running " + strings.Repeat("a=b ", 1000) + "\n" +
		strings.Repeat(manyLabels(50), 3)
	m, err := enginemetrics.Parse(strings.NewReader(text), enginemetrics.KindAuto)
	require.NoError(t, err)
	require.Equal(t, []enginemetrics.Rank{{Running: 1, Reported: true}}, m.Ranks, "the same series three times counts once")
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
// gives loads in range; a text over a limit is refused with an error that
// names the limit. testdata/fuzz/FuzzParse holds a line of 3000 labels,
// which the text parser would take seconds over (its time grows with the
// square of a line's labels).
func FuzzParse(f *testing.F) {
	f.Add(vllmText)
	f.Add(sglangText)
	f.Add(`vllm:num_requests_running{engine="4095"} 1e300` + "\n")
	f.Add(`vllm:cache_config_info{block_size="-1",num_gpu_blocks="x"} 1` + "\n")
	f.Add(manyLabels(enginemetrics.MaxLabels + 1))
	f.Add("# TYPE vllm:num_requests_running gauge\n" + manyLabels(enginemetrics.MaxLabels))
	f.Fuzz(func(t *testing.T, text string) {
		m, err := enginemetrics.Parse(strings.NewReader(text), enginemetrics.KindAuto)
		if err != nil {
			require.ErrorIs(t, err, enginemetrics.ErrMetrics)
			if strings.Count(text, "=") > enginemetrics.MaxLabels && strings.Contains(err.Error(), "labels") {
				require.Regexp(t, `line [0-9]+: more than [0-9]+ labels`, err.Error())
			}
			return
		}
		require.NotEmpty(t, m.Ranks)
		require.LessOrEqual(t, len(m.Ranks), router.MaxDataParallelRanks)
		require.GreaterOrEqual(t, m.BlockSize, 0)
		require.GreaterOrEqual(t, m.GPUBlocks, 0)
		for _, line := range strings.Split(text, "\n") {
			if !strings.HasPrefix(strings.TrimLeft(line, " \t"), "#") {
				require.LessOrEqual(t, strings.Count(line, "="), enginemetrics.MaxLabels, "a line over the label limit was accepted")
			}
		}
		for _, r := range m.Ranks {
			require.GreaterOrEqual(t, r.Running, 0)
			require.GreaterOrEqual(t, r.Waiting, 0)
			require.True(t, r.KVUsage >= 0 && r.KVUsage <= 1)
		}
	})
}

// BenchmarkParse measures Parse's time per byte of text on an engine's
// ordinary text and on the worst cases within the limits: lines with
// MaxLabels labels (the parser's cost per line grows with the square of
// its labels), many series, and a line of too many labels (rejected).
func BenchmarkParse(b *testing.B) {
	var dp strings.Builder
	for r := range 8 {
		for _, name := range []string{"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"} {
			fmt.Fprintf(&dp, "vllm:%s{engine=\"%d\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1\n", name, r)
		}
		for le := range 30 {
			fmt.Fprintf(&dp, "vllm:time_to_first_token_seconds_bucket{engine=\"%d\",le=\"%d\",model_name=\"m\"} 3\n", r, le)
		}
	}
	var labels strings.Builder
	for i := 0; labels.Len() < 1<<18; i++ {
		fmt.Fprintf(&labels, "vllm:num_requests_running{")
		for j := range enginemetrics.MaxLabels - 1 {
			fmt.Fprintf(&labels, "l%d=\"\",", j)
		}
		fmt.Fprintf(&labels, "engine=\"%d\"} 1\n", i)
	}
	var series strings.Builder
	for i := 0; i < enginemetrics.MaxSamples; i++ {
		fmt.Fprintf(&series, "vllm:num_requests_running{engine=\"%d\"} 1\n", i)
	}
	for _, c := range []struct{ name, text string }{
		{"vllm_dp8", vllmText + dp.String()},
		{"max_labels_lines", labels.String()},
		{"max_samples", series.String()},
		{"too_many_labels", manyLabels(100000)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.text)))
			r := strings.NewReader(c.text)
			for b.Loop() {
				r.Reset(c.text)
				_, _ = enginemetrics.Parse(io.Reader(r), enginemetrics.KindAuto)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(c.text)), "ns/byte")
		})
	}
}
