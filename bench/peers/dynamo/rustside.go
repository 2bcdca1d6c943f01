package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// buildRust builds the Rust side with cargo in release mode and returns
// the binary's path. Cargo's output goes to stderr.
func buildRust(ctx context.Context, dir, targetDir string) (string, error) {
	cargo, err := exec.LookPath("cargo")
	if err != nil {
		return "", fmt.Errorf("peers: cargo is needed to build the Dynamo side (or pass -rust-bin): %w", err)
	}
	cmd := exec.CommandContext(ctx, cargo, "build", "--release", "--locked", "--quiet")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CARGO_TARGET_DIR="+targetDir)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("peers: cargo build in %s: %w", dir, err)
	}
	return filepath.Join(targetDir, "release", "dynamo-peer"), nil
}

// runRust runs the Rust side on one workload file, passes times (each
// pass on a new tree, as runKV), and reads its timings and digests.
func runRust(ctx context.Context, bin, file string, passes int) (*sideResult, error) {
	out := file + ".dynamo.digests"
	defer os.Remove(out)
	var stdout, stderr bytes.Buffer
	args := []string{file, "-out", out}
	if passes > 1 {
		args = append(args, "-passes", strconv.Itoa(passes))
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("peers: %s %s: %w: %s", bin, file, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var r sideResult
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		return nil, fmt.Errorf("peers: output of %s: %w", bin, err)
	}
	digests, err := readDigests(out)
	if err != nil {
		return nil, err
	}
	if len(digests) != len(r.Sections) {
		return nil, fmt.Errorf("peers: %s: %d digest sections for %d sections", bin, len(digests), len(r.Sections))
	}
	for i := range r.Sections {
		r.Sections[i].Digests = digests[i]
	}
	return &r, nil
}
