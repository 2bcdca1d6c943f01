package main

import (
	"runtime"
	"testing"
	"time"
)

func TestUseCPUTime(t *testing.T) {
	for _, c := range []struct {
		name    string
		in      []sectionResult
		wantNS  []int64
		wantErr bool
	}{
		{"cpu time replaces elapsed", []sectionResult{{Timed: true, NS: 900, CPUNS: 400}, {NS: 50, CPUNS: 20}}, []int64{400, 20}, false},
		{"untimed section without cpu time", []sectionResult{{NS: 50}}, []int64{0}, false},
		{"timed section without cpu time", []sectionResult{{Name: "apply", Timed: true, NS: 900}}, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := &sideResult{Side: "dynamo", Sections: c.in}
			err := useCPUTime(res)
			if (err != nil) != c.wantErr {
				t.Fatalf("useCPUTime: error %v, want error %v", err, c.wantErr)
			}
			if c.wantErr {
				return
			}
			for i, want := range c.wantNS {
				if got := res.Sections[i].NS; got != want {
					t.Errorf("section %d: NS %d, want %d", i, got, want)
				}
			}
		})
	}
}

func TestProcessCPUAdvances(t *testing.T) {
	before := processCPU()
	if before == 0 {
		if runtime.GOOS == "linux" || runtime.GOOS == "darwin" {
			t.Fatal("processCPU returned 0 on a unix system")
		}
		t.Skip("no process CPU time on " + runtime.GOOS)
	}
	x := uint64(1)
	deadline := time.Now().Add(10 * time.Second)
	for processCPU() < before+20_000_000 { // 20 ms of work
		if time.Now().After(deadline) {
			t.Fatalf("processCPU stayed at %d ns or below for 10 s of work", before+20_000_000)
		}
		for range 100_000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	if x == 0 {
		t.Log(x)
	}
}
