package main

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
)

// configSeeds are configuration files: valid ones first.
var configSeeds = []string{
	`{"listen": ":8080", "block_size": 16, "tokenize_url": "http://10.0.0.7:8000",
	 "engines": [{"id": 1, "url": "http://10.0.0.7:8000", "events": "tcp://10.0.0.7:5557"}]}`,
	`{"listen":":9000","block_size":64,"remove_after":"1m","health_interval":"500ms","max_attempts":2,
	 "engines":[{"id":1,"url":"http://a:8000","events":"tcp://a:5557","replay":"tcp://a:5558","topic":"kv","ranks":2,
	   "max_requests":8,"max_batched_tokens":8192,"kv_capacity_blocks":1000},
	  {"id":6102808441099218236,"url":"https://f:8000","preset":"dynamo","headers":{"X-Pool":"{id}-{rank}"}}],
	 "tokenize_url":"http://a:8000","tokenize_render":true,"adapters":{"m":"lora-a"},"load_reports":"merged"}`,
	`{"block_size":16,"model_dir":"/models/tiny","dynamo":{"store":"etcd:http://127.0.0.1:2379","frontend":"http://127.0.0.1:8000",
	 "model":"tiny","namespace":"dynamo","component":"backend","endpoint":"generate","callback_host":"10.0.0.5"}}`,
	`{}`,
	`{"engines":[{"id":1,"url":"http://a"}],"remove_after":"soon"}`,
	`{"engines":[{"id":1,"url":"http://a"},{"id":1,"url":"http://b"}]}`,
	`{"engines":[{"id":"1","url":"http://a"}]}`,
	`{"engine":[]}`,
	`{"listen":":1"} {}`,
	`{"block_size":70000}`,
	`{"dynamo":{"frontend":"http://f"}}`,
	`{"engines":[{"id":1,"url":"http://a","ranks":100000}]}`,
	`[1,2]`, `null`, `{"listen":`, ``,
}

func TestDecodeConfig(t *testing.T) {
	tests := []struct {
		name  string
		raw   string
		field string // the error's Field; "" with err set: a syntax error
		err   string
	}{
		{name: "doc example", raw: configSeeds[0]},
		{name: "every field", raw: configSeeds[1]},
		{name: "dynamo", raw: configSeeds[2]},
		{name: "empty object", raw: configSeeds[3]},
		{name: "bad duration", raw: configSeeds[4], field: "remove_after", err: `remove_after: time: invalid duration "soon"`},
		{name: "duplicate id", raw: configSeeds[5], field: "engines[1]", err: "engines[1]: id 1 is also engines[0]'s"},
		{name: "id of the wrong type", raw: configSeeds[6], field: "engines.id", err: "JSON string where an integer (uint64) is expected"},
		{name: "unknown field", raw: configSeeds[7], field: "engine", err: `engine: unknown field "engine"`},
		{name: "trailing data", raw: configSeeds[8], err: "more data after the configuration object"},
		{name: "block size", raw: configSeeds[9], field: "block_size", err: "70000 is not between 1 and 65536"},
		{name: "dynamo without store", raw: configSeeds[10], field: "dynamo.store", err: "need a store"},
		{name: "too many ranks", raw: configSeeds[11], field: "engines[0]", err: "100000 ranks"},
		{name: "not an object", raw: configSeeds[12], err: "JSON array where the configuration object is expected"},
		{name: "cut short", raw: configSeeds[14], err: "unexpected end"},
		{name: "empty", raw: configSeeds[15], err: "unexpected end"},
		{name: "bad url", raw: `{"engines":[{"id":3,"url":"ftp://a"}]}`, field: "engines[0]", err: "engines[0]: gateway: invalid engine: engine 3: url"},
		{name: "bad listen", raw: `{"listen":"8080"}`, field: "listen", err: `"8080" is not host:port`},
		{name: "bad tokenize url", raw: `{"tokenize_url":"localhost:8000"}`, field: "tokenize_url"},
		{name: "zero interval", raw: `{"health_interval":"0s"}`, field: "health_interval", err: "not a positive duration"},
		{name: "negative attempts", raw: `{"max_attempts":-1}`, field: "max_attempts"},
		{name: "empty adapter", raw: `{"adapters":{"m":""}}`, field: `adapters["m"]`},
		{name: "dynamo bad frontend", raw: `{"dynamo":{"store":"file:/kv","frontend":"f:8000"}}`, field: "dynamo.frontend"},
		{name: "dynamo bad store", raw: `{"dynamo":{"store":"/kv","frontend":"http://f:8000"}}`, field: "dynamo", err: "neither file:DIR nor etcd"},
		{name: "syntax", raw: `{"listen" ":80"}`, err: "at byte 11: invalid character"},
		{name: "bad load reports", raw: `{"load_reports":"max"}`, field: "load_reports", err: "want capacities or merged"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := decodeConfig([]byte(tt.raw))
			if tt.field == "" && tt.err == "" {
				require.NoError(t, err)
				checkRoundTrip(t, s)
				return
			}
			require.ErrorIs(t, err, errConfig)
			var ce *configError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, tt.field, ce.Field)
			require.ErrorContains(t, err, tt.err)
		})
	}
	s, err := decodeConfig([]byte(configSeeds[1]))
	require.NoError(t, err)
	require.Equal(t, 500*time.Millisecond, s.interval)
	require.Equal(t, time.Minute, s.remove)
	require.Len(t, s.file.Engines, 2)
	require.Equal(t, router.LoadReportMerged, s.loadReports)
}

// TestParseFileAndFlags: explicit duration flags win over the file.
func TestParseFileAndFlags(t *testing.T) {
	path := t.TempDir() + "/gw.json"
	require.NoError(t, os.WriteFile(path, []byte(configSeeds[1]), 0o600))
	o, err := parse([]string{"-config", path, "-health-interval", "3s"}, nil)
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, o.interval)
	require.Equal(t, time.Minute, o.remove)
	require.Equal(t, router.LoadReportMerged, o.loadReports, "from the file")
	_, err = parse([]string{"-config", path, "-engine", "1=http://c:1"}, nil)
	require.NoError(t, err, "a duplicate id across the file and the flags is found by the gateway, which names both")
	o, err = parse([]string{"-config", path, "-load-reports", "capacities"}, nil)
	require.NoError(t, err)
	require.Equal(t, router.LoadReportCapacities, o.loadReports, "the flag wins")
	_, err = parse([]string{"-config", path, "-load-reports", "max"}, nil)
	require.ErrorContains(t, err, "want capacities or merged")
}

// checkRoundTrip: an accepted configuration encodes to JSON that decodes
// to the same configuration, and its settings are the checked ones.
func checkRoundTrip(t *testing.T, s fileSettings) {
	t.Helper()
	b1, err := json.Marshal(s.file)
	require.NoError(t, err)
	again, err := decodeConfig(b1)
	require.NoError(t, err, "re-encoded: %s", b1)
	b2, err := json.Marshal(again.file)
	require.NoError(t, err)
	require.Equal(t, string(b1), string(b2))
	require.Equal(t, s.interval, again.interval)
	require.Equal(t, s.remove, again.remove)
	ids := map[uint64]bool{}
	for _, e := range s.file.Engines {
		require.NoError(t, e.Validate())
		require.False(t, ids[uint64(e.ID)], "duplicate id %d accepted", e.ID)
		ids[uint64(e.ID)] = true
	}
	if s.file.HealthInterval != "" {
		require.Positive(t, s.interval)
	}
	require.GreaterOrEqual(t, s.remove, time.Duration(0))
}

// configFields are the configuration file's top-level JSON names.
func configFields() map[string]bool {
	out := map[string]bool{}
	typ := reflect.TypeFor[fileConfig]()
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		out[name] = true
	}
	return out
}

// FuzzDecodeConfig: any file decodes or fails with a *configError that
// names a setting of the file (or a byte inside it) and says what is
// wrong; an accepted file round-trips through its JSON encoding.
func FuzzDecodeConfig(f *testing.F) {
	for _, s := range configSeeds {
		f.Add([]byte(s))
	}
	fields := configFields()
	f.Fuzz(func(t *testing.T, raw []byte) {
		s, err := decodeConfig(raw)
		if err == nil {
			checkRoundTrip(t, s)
			return
		}
		var ce *configError
		if !errors.As(err, &ce) || !errors.Is(err, errConfig) {
			t.Fatalf("error %v (%T) is not a configError", err, err)
		}
		require.NotNil(t, ce.Err)
		require.NotEmpty(t, ce.Err.Error())
		if ce.Field == "" {
			require.True(t, ce.Offset >= 0 && ce.Offset <= int64(len(raw)), "offset %d outside %d bytes", ce.Offset, len(raw))
			return
		}
		require.Contains(t, err.Error(), ce.Field)
		if strings.HasPrefix(ce.Err.Error(), "unknown field ") {
			// The unknown name itself, at any depth, quoted in the message.
			require.Contains(t, ce.Err.Error(), strconv.Quote(ce.Field))
			return
		}
		path := strings.FieldsFunc(ce.Field, func(r rune) bool { return r == '.' || r == '[' })
		require.NotEmpty(t, path, "field %q names no setting", ce.Field)
		require.True(t, fields[path[0]], "field %q is not a setting of the file", ce.Field)
	})
}
