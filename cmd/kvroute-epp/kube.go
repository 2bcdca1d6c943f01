package main

import (
	"context"
	"fmt"
	"log/slog"

	"k8s.io/client-go/dynamic"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/kube"
)

// startKube watches the pool's pods with the in-cluster credentials
// (the pod's service account), reading the selector and target ports
// from the InferencePool when -kube-pool names one.
func startKube(ctx context.Context, cfg *config, sink discovery.Sink, log *slog.Logger, errs chan<- error) error {
	rc, err := rest.InClusterConfig()
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	k := cfg.Kube
	if k.Pool != "" {
		dc, err := dynamic.NewForConfig(rc)
		if err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
		if k.Selector, k.Ports, err = kube.PoolSpec(ctx, dc, k.Namespace, k.Pool); err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
		log.Info("InferencePool read", "pool", k.Namespace+"/"+k.Pool, "selector", k.Selector, "ports", k.Ports)
	}
	cs, err := corev1client.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	w := &kube.Watcher{Client: cs, Namespace: k.Namespace, Selector: k.Selector, TargetPorts: k.Ports,
		EventsPort: k.EventsPort, ReplayPort: k.ReplayPort, Logger: log}
	go func() { errs <- w.Run(ctx, sink) }()
	return nil
}
