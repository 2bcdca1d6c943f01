package bench

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"
)

// Summary is the distribution of a duration over requests or decisions.
type Summary struct {
	Mean, P50, P99, Max time.Duration
}

// EventStats counts the KV-event traffic of a run.
type EventStats struct {
	StoredBlocks  uint64 `json:"stored_blocks"`  // blocks engines published as stored
	RemovedBlocks uint64 `json:"removed_blocks"` // blocks engines published as removed
	Batches       int64  `json:"batches"`        // encoded batches published
	Bytes         int64  `json:"bytes"`          // encoded bytes published
	Events        int64  `json:"events"`         // converted events applied to the index
	ApplyErrors   int64  `json:"apply_errors"`   // events the index rejected (unknown parents, gaps)
	DecodeErrors  int64  `json:"decode_errors"`  // batches that failed to decode or convert
	EncodeErrors  int64  `json:"encode_errors"`  // batches that failed to encode
}

// Result is what one simulated run measured.
type Result struct {
	Workload string
	Policy   string
	Workers  int
	// Requests is the number of finished requests.
	Requests int
	// PromptTokens, CachedTokens and OutputTokens are totals over the
	// finished requests; CachedTokens are the prompt tokens the engines
	// found in their caches (what they report as num_cached_tokens).
	PromptTokens, CachedTokens, OutputTokens int64
	// HitRate is CachedTokens / PromptTokens.
	HitRate float64
	// PredictedHitRate is the share of prompt tokens the router's index
	// predicted cached on the chosen worker, and RoutingAccuracy the
	// router's accuracy of those predictions (router.Stats).
	PredictedHitRate, RoutingAccuracy float64
	// TTFT is the time from arrival to first token; Latency from arrival
	// to the last token. Both include time held at the router while every
	// worker was busy and time queued in the engine.
	TTFT, Latency Summary
	// Duration is the virtual time from the start to the last completion.
	Duration time.Duration
	// Throughput is finished requests per virtual second, and
	// OutputTokensPerSecond the generated tokens per virtual second.
	Throughput, OutputTokensPerSecond float64
	// LoadImbalance is the largest time-averaged number of active
	// requests (running and queued) of an engine divided by the mean over
	// the engines: 1 is perfect balance, Workers is everything on one
	// engine.
	LoadImbalance float64
	// PeakImbalance is the time average of the busiest engine's active
	// requests at each moment divided by the time average of the mean
	// engine's: it also counts short bursts, so even a perfect balancer
	// stays above 1 when engines hold few requests each.
	PeakImbalance float64
	// ActivePerWorker is each engine's time-averaged number of active
	// requests (running and queued).
	ActivePerWorker []float64
	// Select is the wall time of each Router.SelectInto call: the router's
	// CPU time per decision.
	Select Summary
	// Deferrals counts requests held at the router because every worker
	// was busy (policies with busy thresholds).
	Deferrals int
	// Events is the KV-event traffic.
	Events EventStats
	// WallTime is how long the simulation took.
	WallTime time.Duration
}

// columns are the report's columns: header, and the cell of a result.
var columns = []struct {
	name string
	cell func(*Result) string
}{
	{"workload", func(r *Result) string { return r.Workload }},
	{"policy", func(r *Result) string { return r.Policy }},
	{"hit_rate", func(r *Result) string { return pct(r.HitRate) }},
	{"ttft_p50_ms", func(r *Result) string { return ms(r.TTFT.P50) }},
	{"ttft_p99_ms", func(r *Result) string { return ms(r.TTFT.P99) }},
	{"e2e_p50_ms", func(r *Result) string { return ms(r.Latency.P50) }},
	{"e2e_p99_ms", func(r *Result) string { return ms(r.Latency.P99) }},
	{"req_per_s", func(r *Result) string { return strconv.FormatFloat(r.Throughput, 'f', 2, 64) }},
	{"out_tok_per_s", func(r *Result) string { return strconv.FormatFloat(r.OutputTokensPerSecond, 'f', 0, 64) }},
	{"load_max_mean", func(r *Result) string { return strconv.FormatFloat(r.LoadImbalance, 'f', 3, 64) }},
	{"peak_max_mean", func(r *Result) string { return strconv.FormatFloat(r.PeakImbalance, 'f', 3, 64) }},
	{"select_mean_us", func(r *Result) string { return us(r.Select.Mean) }},
	{"select_p99_us", func(r *Result) string { return us(r.Select.P99) }},
}

func pct(f float64) string      { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }
func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) }
func us(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 2, 64) }
func header() []string          { return mapColumns(func(i int) string { return columns[i].name }) }
func row(r *Result) []string    { return mapColumns(func(i int) string { return columns[i].cell(r) }) }
func mapColumns(f func(int) string) []string {
	out := make([]string, len(columns))
	for i := range columns {
		out[i] = f(i)
	}
	return out
}

// WriteTable writes results as an aligned text table.
func WriteTable(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	write := func(cells []string) {
		for _, c := range cells {
			fmt.Fprint(tw, c, "\t")
		}
		fmt.Fprintln(tw)
	}
	write(header())
	for i := range results {
		write(row(&results[i]))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("bench: write table: %w", err)
	}
	return nil
}

// WriteCSV writes results as CSV with a header row; the columns are those
// of WriteTable.
func WriteCSV(w io.Writer, results []Result) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(header()); err != nil {
		return fmt.Errorf("bench: write csv: %w", err)
	}
	for i := range results {
		if err := cw.Write(row(&results[i])); err != nil {
			return fmt.Errorf("bench: write csv: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("bench: write csv: %w", err)
	}
	return nil
}

// jsonSummary is a Summary in milliseconds or microseconds for JSON.
type jsonSummary struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

func toJSONSummary(s Summary, unit time.Duration) jsonSummary {
	u := float64(unit)
	return jsonSummary{Mean: float64(s.Mean) / u, P50: float64(s.P50) / u, P99: float64(s.P99) / u, Max: float64(s.Max) / u}
}

// jsonResult is the JSON form of a Result.
type jsonResult struct {
	Workload              string      `json:"workload"`
	Policy                string      `json:"policy"`
	Workers               int         `json:"workers"`
	Requests              int         `json:"requests"`
	PromptTokens          int64       `json:"prompt_tokens"`
	CachedTokens          int64       `json:"cached_tokens"`
	OutputTokens          int64       `json:"output_tokens"`
	HitRate               float64     `json:"hit_rate"`
	PredictedHitRate      float64     `json:"predicted_hit_rate"`
	RoutingAccuracy       float64     `json:"routing_accuracy"`
	TTFTMs                jsonSummary `json:"ttft_ms"`
	LatencyMs             jsonSummary `json:"e2e_latency_ms"`
	DurationS             float64     `json:"duration_s"`
	Throughput            float64     `json:"requests_per_s"`
	OutputTokensPerSecond float64     `json:"output_tokens_per_s"`
	LoadImbalance         float64     `json:"load_max_over_mean"`
	PeakImbalance         float64     `json:"peak_max_over_mean"`
	ActivePerWorker       []float64   `json:"active_per_worker"`
	SelectUs              jsonSummary `json:"select_us"`
	Deferrals             int         `json:"deferrals"`
	Events                EventStats  `json:"kv_events"`
	WallTimeS             float64     `json:"wall_time_s"`
}

// WriteJSON writes results as an indented JSON array. Durations are in
// milliseconds (TTFT, latency), microseconds (Select) or seconds.
func WriteJSON(w io.Writer, results []Result) error {
	out := make([]jsonResult, len(results))
	for i := range results {
		r := &results[i]
		out[i] = jsonResult{
			Workload: r.Workload, Policy: r.Policy, Workers: r.Workers, Requests: r.Requests,
			PromptTokens: r.PromptTokens, CachedTokens: r.CachedTokens, OutputTokens: r.OutputTokens,
			HitRate: r.HitRate, PredictedHitRate: r.PredictedHitRate, RoutingAccuracy: r.RoutingAccuracy,
			TTFTMs: toJSONSummary(r.TTFT, time.Millisecond), LatencyMs: toJSONSummary(r.Latency, time.Millisecond),
			DurationS: r.Duration.Seconds(), Throughput: r.Throughput, OutputTokensPerSecond: r.OutputTokensPerSecond,
			LoadImbalance: r.LoadImbalance, PeakImbalance: r.PeakImbalance, ActivePerWorker: r.ActivePerWorker, SelectUs: toJSONSummary(r.Select, time.Microsecond),
			Deferrals: r.Deferrals, Events: r.Events, WallTimeS: r.WallTime.Seconds(),
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return fmt.Errorf("bench: write json: %w", err)
	}
	return nil
}

// Write writes results in the named format: "table", "csv" or "json".
func Write(w io.Writer, format string, results []Result) error {
	switch format {
	case "table", "":
		return WriteTable(w, results)
	case "csv":
		return WriteCSV(w, results)
	case "json":
		return WriteJSON(w, results)
	}
	return fmt.Errorf("%w: unknown format %q (table, csv, json)", ErrInvalidConfig, format)
}
