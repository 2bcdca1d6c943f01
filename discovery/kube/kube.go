// Package kube discovers inference engines in Kubernetes: the pods an
// InferencePool selects (its label selector and target ports), watched
// with a client-go informer and fed to a discovery.Sink.
//
// # Usage
//
//	cs, _ := kubernetes.NewForConfig(restConfig)
//	w := &kube.Watcher{Client: cs.CoreV1(), Namespace: "default", Selector: "app=vllm-llama", TargetPorts: []int{8000}}
//	return w.Run(ctx, pool) // a *discovery.Pool
//
// PoolSpec reads the selector and target ports from an InferencePool
// object (group inference.networking.k8s.io, v1) with a dynamic client, so
// the picker can be pointed at the pool by name.
//
// # Pods
//
// A pod is ready when it is running, not being deleted, has an IP and its
// Ready condition is true; others are reported as not ready (the Pool
// leaves them out). Its engine is named "namespace/name". Data-parallel
// rank r is served on TargetPorts[r] (one target port per rank, as an
// InferencePool lists them); with a single target port, annotation
// kvroute.io/dp-ranks N gives N ranks on consecutive ports.
//
// Annotations (all optional):
//
//	kvroute.io/kv-events   ZMQ PUB endpoint of rank 0: a port ("5557", on the pod IP) or "tcp://host:port"
//	kvroute.io/kv-replay   ZMQ replay endpoint of rank 0, in the same forms
//	kvroute.io/kv-topic    KV-event topic
//	kvroute.io/metrics     metrics URL, or a port ("8000", path /metrics); default http://<pod IP>:<first target port>/metrics
//	kvroute.io/engine      "vllm" or "sglang" (metric names; default: detected)
//	kvroute.io/dp-ranks    number of data-parallel ranks when there is one target port
//
// Without kvroute.io/kv-events, Watcher.EventsPort (a port convention
// for the whole pool) gives the events endpoint, and
// Watcher.ReplayPort the replay endpoint; zero means none.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/router"
)

// Annotation names read from pods.
const (
	AnnotationEvents  = "kvroute.io/kv-events"
	AnnotationReplay  = "kvroute.io/kv-replay"
	AnnotationTopic   = "kvroute.io/kv-topic"
	AnnotationMetrics = "kvroute.io/metrics"
	AnnotationEngine  = "kvroute.io/engine"
	AnnotationRanks   = "kvroute.io/dp-ranks"
)

// ErrConfig is wrapped by errors about a Watcher's fields or an
// InferencePool.
var ErrConfig = errors.New("kube: invalid configuration")

// Watcher feeds the pods matching a label selector to a discovery.Sink.
type Watcher struct {
	// Client reads pods: a clientset's CoreV1(). Required. (Only the core
	// API group is used, which keeps client-go's share of the build
	// small.)
	Client corev1client.PodsGetter
	// Namespace is the pods' namespace; empty means all namespaces.
	Namespace string
	// Selector is the pods' label selector ("app=vllm,tier in (a,b)").
	// Required.
	Selector string
	// TargetPorts are the engines' HTTP ports, one per data-parallel
	// rank. Required.
	TargetPorts []int
	// EventsPort and ReplayPort are the pool's KV-event ports when pods
	// have no annotation; zero means none.
	EventsPort, ReplayPort int
	// Resync is the informer's resync period; zero means none.
	Resync time.Duration
	// Logger receives pods left out. Nil discards.
	Logger *slog.Logger
}

// Run watches the pods until ctx ends, calling sink.Sync with every
// matching pod after the initial list and after each change; it returns
// ctx's error.
func (w *Watcher) Run(ctx context.Context, sink discovery.Sink) error {
	if w.Client == nil || sink == nil || len(w.TargetPorts) == 0 {
		return fmt.Errorf("%w: Client, TargetPorts and a sink are required", ErrConfig)
	}
	sel, err := labels.Parse(w.Selector)
	if err != nil || w.Selector == "" {
		return fmt.Errorf("%w: selector %q: %v", ErrConfig, w.Selector, err)
	}
	log := w.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pods := w.Client.Pods(w.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel.String()
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel.String()
			return pods.Watch(ctx, o)
		},
	}
	// A client that cannot stream lists (a fake) says so.
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, w.Client), &corev1.Pod{}, w.Resync, cache.Indexers{})
	changed := make(chan struct{}, 1)
	notify := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: notify, DeleteFunc: notify, UpdateFunc: func(_, n any) { notify(n) },
	}); err != nil {
		return err
	}
	ictx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		inf.RunWithContext(ictx)
	}()
	defer func() {
		stop()
		<-ran
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	// The last valid description of each pod: a ready pod whose
	// annotations go bad keeps it (and its worker its index) until it is
	// fixed, stops being ready or goes.
	lastValid := map[podKey]discovery.Engine{}
	for {
		var list []*corev1.Pod
		for _, obj := range inf.GetStore().List() {
			if p, ok := obj.(*corev1.Pod); ok && sel.Matches(labels.Set(p.Labels)) {
				list = append(list, p)
			}
		}
		engines := make([]discovery.Engine, 0, len(list))
		seen := make(map[podKey]bool, len(list))
		for _, p := range list {
			k := podKey{p.Namespace, p.Name, p.UID}
			seen[k] = true
			e, err := w.Engine(p)
			if err != nil {
				last, ok := lastValid[k]
				if !ok {
					log.WarnContext(ctx, "kube: pod left out", "pod", p.Namespace+"/"+p.Name, "err", err)
					continue
				}
				log.WarnContext(ctx, "kube: invalid pod description, keeping its last valid one", "pod", p.Namespace+"/"+p.Name, "err", err)
				e = last
			}
			lastValid[k] = e
			engines = append(engines, e)
		}
		maps.DeleteFunc(lastValid, func(k podKey, _ discovery.Engine) bool { return !seen[k] })
		slices.SortFunc(engines, func(a, b discovery.Engine) int { return strings.Compare(a.Name, b.Name) })
		sink.Sync(ctx, engines)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// podKey identifies a pod: one recreated under its name is another.
type podKey struct {
	namespace, name string
	uid             types.UID
}

// Ready reports whether a pod can serve: running, not being deleted, with
// an IP and a true Ready condition.
func Ready(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Engine describes a pod as a discovery.Engine (see the package doc for
// the annotations). Errors wrap discovery.ErrEngine.
func (w *Watcher) Engine(p *corev1.Pod) (discovery.Engine, error) {
	e := discovery.Engine{
		Name:  p.Namespace + "/" + p.Name,
		Host:  p.Status.PodIP,
		Ports: slices.Clone(w.TargetPorts),
		Ready: Ready(p),
		Topic: p.Annotations[AnnotationTopic],
		Kind:  p.Annotations[AnnotationEngine],
	}
	if !e.Ready {
		return e, nil // the Pool leaves it out without looking further
	}
	if s, ok := p.Annotations[AnnotationRanks]; ok {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > router.MaxDataParallelRanks || len(w.TargetPorts) != 1 {
			return e, fmt.Errorf("%w: %s: %s %q needs one target port and a count from 1 to %d",
				discovery.ErrEngine, e.Name, AnnotationRanks, s, router.MaxDataParallelRanks)
		}
		e.Ports = e.Ports[:0]
		for r := range n {
			e.Ports = append(e.Ports, w.TargetPorts[0]+r)
		}
	}
	var err error
	if e.Events, err = endpoint(e.Host, p.Annotations[AnnotationEvents], w.EventsPort); err != nil {
		return e, fmt.Errorf("%w: %s: %s: %w", discovery.ErrEngine, e.Name, AnnotationEvents, err)
	}
	if e.Replay, err = endpoint(e.Host, p.Annotations[AnnotationReplay], w.ReplayPort); err != nil {
		return e, fmt.Errorf("%w: %s: %s: %w", discovery.ErrEngine, e.Name, AnnotationReplay, err)
	}
	if e.Events == "" {
		e.Replay = ""
	}
	if len(e.Ports) == 0 {
		return e, fmt.Errorf("%w: %s: the watcher has no target ports", discovery.ErrEngine, e.Name)
	}
	e.Metrics = "http://" + net.JoinHostPort(e.Host, strconv.Itoa(e.Ports[0])) + "/metrics"
	if m := p.Annotations[AnnotationMetrics]; m != "" {
		if port, err := strconv.Atoi(m); err == nil {
			e.Metrics = "http://" + net.JoinHostPort(e.Host, strconv.Itoa(port)) + "/metrics"
		} else {
			e.Metrics = m
		}
	}
	return e, e.Validate()
}

// endpoint turns an annotation (a port or a tcp:// endpoint) or the
// pool's port into a ZMQ endpoint on host.
func endpoint(host, annotation string, port int) (string, error) {
	switch {
	case strings.HasPrefix(annotation, "tcp://"):
		return annotation, nil
	case annotation != "":
		p, err := strconv.Atoi(annotation)
		if err != nil || p < 1 || p > 65535 {
			return "", fmt.Errorf("%q is neither a port nor tcp://host:port", annotation)
		}
		port = p
	}
	if port == 0 {
		return "", nil
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port)), nil
}

// InferencePoolResource is GIE's InferencePool resource.
var InferencePoolResource = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// PoolSpec reads an InferencePool's label selector (spec.selector
// .matchLabels) and target ports (spec.targetPorts[].number). Errors wrap
// ErrConfig or the client's.
func PoolSpec(ctx context.Context, client dynamic.Interface, namespace, name string) (selector string, ports []int, err error) {
	obj, err := client.Resource(InferencePoolResource).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", nil, err
	}
	match, found, err := unstructured.NestedStringMap(obj.Object, "spec", "selector", "matchLabels")
	if err != nil || !found || len(match) == 0 {
		return "", nil, fmt.Errorf("%w: InferencePool %s/%s has no spec.selector.matchLabels", ErrConfig, namespace, name)
	}
	list, found, err := unstructured.NestedSlice(obj.Object, "spec", "targetPorts")
	if err != nil || !found || len(list) == 0 {
		return "", nil, fmt.Errorf("%w: InferencePool %s/%s has no spec.targetPorts", ErrConfig, namespace, name)
	}
	for i, item := range list {
		m, ok := item.(map[string]any)
		if !ok {
			return "", nil, fmt.Errorf("%w: InferencePool %s/%s: targetPorts[%d] is not an object", ErrConfig, namespace, name, i)
		}
		n, found, err := unstructured.NestedInt64(m, "number")
		if err != nil || !found || n < 1 || n > 65535 {
			return "", nil, fmt.Errorf("%w: InferencePool %s/%s: targetPorts[%d].number", ErrConfig, namespace, name, i)
		}
		ports = append(ports, int(n))
	}
	return labels.SelectorFromSet(match).String(), ports, nil
}
