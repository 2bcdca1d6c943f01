package enginemetrics

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// ErrMetrics is wrapped by errors about an engine's metrics text.
var ErrMetrics = errors.New("enginemetrics: unreadable metrics")

// Kind is the engine whose metric names are read.
type Kind uint8

// The engine kinds.
const (
	// KindAuto reads whichever of vLLM's and SGLang's names are present.
	KindAuto Kind = iota
	KindVLLM
	KindSGLang
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case KindAuto:
		return "auto"
	case KindVLLM:
		return "vllm"
	case KindSGLang:
		return "sglang"
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// ParseKind parses "auto", "vllm" or "sglang".
func ParseKind(s string) (Kind, error) {
	switch s {
	case "", "auto":
		return KindAuto, nil
	case "vllm":
		return KindVLLM, nil
	case "sglang":
		return KindSGLang, nil
	}
	return 0, fmt.Errorf("enginemetrics: unknown engine kind %q (want auto, vllm or sglang)", s)
}

// Rank is one data-parallel rank's load as its engine reports it.
type Rank struct {
	Running int
	Waiting int
	// KVUsage is the fraction of the KV cache in use, 0 to 1.
	KVUsage float64
	// Reported is set when the text had samples of this rank; a rank
	// below the highest one reported may have none.
	Reported bool
}

// Metrics is what one scrape says about an engine.
type Metrics struct {
	// Kind is the engine the names were recognised as (never KindAuto
	// when Ranks is not empty).
	Kind Kind
	// Ranks holds each data-parallel rank's load, by rank.
	Ranks []Rank
	// BlockSize and GPUBlocks are vLLM's cache_config_info labels, zero
	// when the engine does not say.
	BlockSize int
	GPUBlocks int
}

// Load returns rank r's load as a router load report.
func (m *Metrics) Load(r int) scheduling.Load {
	if r < 0 || r >= len(m.Ranks) {
		return scheduling.Load{}
	}
	rk := m.Ranks[r]
	return scheduling.Load{
		ActiveRequests:   rk.Running,
		QueueDepth:       rk.Waiting,
		KVUtilization:    rk.KVUsage,
		KVCapacityBlocks: m.GPUBlocks,
	}
}

// maxRanks bounds the rank labels read, as router.MaxDataParallelRanks
// bounds workers.
const maxRanks = router.MaxDataParallelRanks

type gauge uint8

const (
	gRunning gauge = iota
	gWaiting
	gUsage
)

// names maps metric names to what they mean, per kind.
var names = map[string]struct {
	kind Kind
	g    gauge
}{
	"vllm:num_requests_running": {KindVLLM, gRunning},
	"vllm:num_requests_waiting": {KindVLLM, gWaiting},
	"vllm:kv_cache_usage_perc":  {KindVLLM, gUsage},
	"vllm:gpu_cache_usage_perc": {KindVLLM, gUsage},
	"sglang:num_running_reqs":   {KindSGLang, gRunning},
	"sglang:num_queue_reqs":     {KindSGLang, gWaiting},
	"sglang:token_usage":        {KindSGLang, gUsage},
}

// Limits of Parse. They keep its time and memory linear in the text's
// size: Prometheus' text parser checks a series' label names for
// duplicates once per label, in time quadratic in their number, so a
// single line of a few hundred kilobytes of labels would otherwise take
// minutes.
const (
	// MaxTextBytes bounds the text Parse reads.
	MaxTextBytes = 8 << 20
	// MaxLabels bounds the labels of one sample line (counted as its '='
	// bytes, an upper bound). Engines' series have a few dozen at most.
	MaxLabels = 64
	// MaxSamples bounds the sample lines of one text.
	MaxSamples = 1 << 17
)

// Parse reads a Prometheus text exposition (format 0.0.4) of an engine of
// the given kind. Errors wrap ErrMetrics; text with none of the engine's
// metrics is an error too, since it is not an engine's, and so is a text
// beyond MaxTextBytes, MaxLabels or MaxSamples (the error names the line).
func Parse(in io.Reader, kind Kind) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(&limitReader{r: in, line: 1, atStart: true})
	if err != nil {
		return Metrics{}, fmt.Errorf("%w: %w", ErrMetrics, err)
	}
	var m Metrics
	if fam, ok := fams["vllm:cache_config_info"]; ok && kind != KindSGLang {
		m.readCacheConfig(fam)
	}
	m.Kind = kind
	if kind == KindAuto {
		m.Kind = detect(fams)
	}
	// A gauge's value per rank and per series of other labels than the
	// parallel ranks (a model): the series that differ only in
	// tensor-, pipeline- or expert-parallel rank are copies of one value
	// (SGLang's schedulers each report their batch), and count once;
	// different models' values add up.
	type key struct {
		g     gauge
		rank  int
		model string
	}
	vals := map[key]float64{}
	var order []key
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		n, ok := names[name]
		if !ok || n.kind != m.Kind {
			continue
		}
		for _, s := range fams[name].GetMetric() {
			v, ok := value(s)
			if !ok {
				continue
			}
			r, ok := rankOf(s)
			if !ok {
				continue
			}
			k := key{n.g, r, modelOf(s)}
			if old, ok := vals[k]; !ok {
				vals[k] = v
				order = append(order, k)
			} else {
				vals[k] = max(old, v)
			}
		}
	}
	if len(order) == 0 {
		return Metrics{}, fmt.Errorf("%w: no %s load metrics", ErrMetrics, kind)
	}
	for _, k := range order {
		for len(m.Ranks) <= k.rank {
			m.Ranks = append(m.Ranks, Rank{})
		}
		rk, v := &m.Ranks[k.rank], vals[k]
		rk.Reported = true
		switch k.g {
		case gRunning:
			rk.Running += count(v)
		case gWaiting:
			rk.Waiting += count(v)
		case gUsage:
			rk.KVUsage = max(rk.KVUsage, min(max(v, 0), 1))
		}
	}
	return m, nil
}

// detect returns the engine kind whose load metrics a text has: vLLM's
// when it has both engines' names (a fixed choice, whatever the order of
// the text), KindAuto when it has neither.
func detect(fams map[string]*dto.MetricFamily) Kind {
	found := KindAuto
	for name := range fams {
		if n, ok := names[name]; ok && (found == KindAuto || n.kind == KindVLLM) {
			found = n.kind
		}
	}
	return found
}

// parallelLabels name a sample's tensor-, pipeline- and expert-parallel
// ranks and its data-parallel rank: series that differ only in them are
// not different models.
var parallelLabels = map[string]bool{"tp_rank": true, "pp_rank": true, "moe_ep_rank": true, "engine": true, "dp_rank": true}

// modelOf returns a sample's labels but the parallel ranks, as one string.
func modelOf(s *dto.Metric) string {
	var b strings.Builder
	for _, l := range s.GetLabel() {
		if !parallelLabels[l.GetName()] {
			b.WriteString(l.GetName())
			b.WriteByte(0)
			b.WriteString(l.GetValue())
			b.WriteByte(0)
		}
	}
	return b.String()
}

// value returns a gauge's, counter's or untyped sample's value when it is
// a finite number.
func value(s *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case s.GetGauge() != nil:
		v = s.GetGauge().GetValue()
	case s.GetUntyped() != nil:
		v = s.GetUntyped().GetValue()
	case s.GetCounter() != nil:
		v = s.GetCounter().GetValue()
	default:
		return 0, false
	}
	return v, !math.IsNaN(v) && !math.IsInf(v, 0)
}

// count turns a sample into a non-negative count.
func count(v float64) int {
	if v <= 0 {
		return 0
	}
	return int(min(v, 1<<31))
}

// rankOf returns a sample's data-parallel rank: its "engine" (vLLM) or
// "dp_rank" (SGLang) label, 0 without one; false for a label that is not
// a rank.
func rankOf(s *dto.Metric) (int, bool) {
	for _, l := range s.GetLabel() {
		if l.GetName() == "engine" || l.GetName() == "dp_rank" {
			r, err := strconv.Atoi(l.GetValue())
			return r, err == nil && r >= 0 && r < maxRanks
		}
	}
	return 0, true
}

// readCacheConfig reads block_size and num_gpu_blocks from vLLM's info
// metric.
func (m *Metrics) readCacheConfig(fam *dto.MetricFamily) {
	for _, s := range fam.GetMetric() {
		for _, l := range s.GetLabel() {
			n, err := strconv.Atoi(l.GetValue())
			if err != nil || n < 0 {
				continue
			}
			switch l.GetName() {
			case "block_size":
				m.BlockSize = n
			case "num_gpu_blocks":
				m.GPUBlocks = n
			}
		}
	}
}

// errLimit is wrapped by limitReader's errors.
var errLimit = errors.New("beyond the parser's limits")

// limitReader passes a metrics text through to the parser and fails it,
// before the parser sees the offending byte, at the first sample line with
// more than MaxLabels labels, the first sample beyond MaxSamples, or the
// first byte beyond MaxTextBytes. It counts a line's '=' bytes: every
// label has one, so it bounds the labels whatever their quoting. Comment
// lines (HELP, TYPE) are not counted. It works in one pass as the bytes go
// by.
type limitReader struct {
	r       io.Reader
	read    int64 // bytes passed on
	line    int   // 1-based number of the current line
	eq      int   // '=' bytes on the current line
	samples int   // sample lines started
	atStart bool  // only blanks and tabs so far on the line
	comment bool  // the line is a comment
	err     error
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	if rest := MaxTextBytes + 1 - l.read; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := l.r.Read(p)
	for i, c := range p[:n] {
		if l.read+int64(i) >= MaxTextBytes {
			return l.fail(i, fmt.Errorf("%w: the text is longer than %d bytes", errLimit, MaxTextBytes))
		}
		switch {
		case c == '\n':
			l.line++
			l.eq, l.atStart, l.comment = 0, true, false
		case l.atStart && (c == ' ' || c == '\t'):
		case l.atStart:
			l.atStart = false
			l.comment = c == '#'
			if !l.comment {
				if l.samples++; l.samples > MaxSamples {
					return l.fail(i, fmt.Errorf("%w: line %d: more than %d samples", errLimit, l.line, MaxSamples))
				}
			}
			if c == '=' {
				l.eq++
			}
		case c == '=' && !l.comment:
			if l.eq++; l.eq > MaxLabels {
				return l.fail(i, fmt.Errorf("%w: line %d: more than %d labels", errLimit, l.line, MaxLabels))
			}
		}
	}
	l.read += int64(n)
	return n, err
}

// fail passes on the n bytes before the offending one and keeps err for
// every later read.
func (l *limitReader) fail(n int, err error) (int, error) {
	l.read += int64(n)
	l.err = err
	return n, nil
}
