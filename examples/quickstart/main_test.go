package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRunPrintsEveryPolicy(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run([]string{"-requests", "300"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"random", "round-robin", "least-loaded", "weighted", "dynamo", "kvroute", "hit_rate"} {
		if !strings.Contains(out.String(), name) {
			t.Errorf("output lacks %q:\n%s", name, out.String())
		}
	}
	if !strings.Contains(errOut.String(), "simulating") {
		t.Errorf("no progress on stderr: %q", errOut.String())
	}
}

func TestRunRejectsUnknownFormat(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run([]string{"-requests", "50", "-format", "xml"}, &out, &errOut); err == nil {
		t.Fatal("want an error for format xml")
	}
}
