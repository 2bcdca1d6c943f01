package kube_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	dynfake "k8s.io/client-go/dynamic/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	corev1fake "k8s.io/client-go/kubernetes/typed/core/v1/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/kube"
	"github.com/kvroute/kvroute/epp"
	"github.com/kvroute/kvroute/router"
)

func pod(name, ip string, ready bool, labels, annotations map[string]string) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: labels, Annotations: annotations},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

// recorder is a Sink that keeps the last set of ready engines.
type recorder struct {
	mu   sync.Mutex
	last []discovery.Engine
}

func (r *recorder) Sync(_ context.Context, engines []discovery.Engine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = engines
}

func (r *recorder) ready() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var names []string
	for _, e := range r.last {
		if e.Ready {
			names = append(names, e.Name)
		}
	}
	return strings.Join(names, ",")
}

type sinks []discovery.Sink

func (s sinks) Sync(ctx context.Context, engines []discovery.Engine) {
	for _, k := range s {
		k.Sync(ctx, engines)
	}
}

// fakePods is client-go's fake core client over an object tracker, as
// client-go's fake clientset builds it: no Kubernetes API server can be
// installed from the package registries this project uses.
func fakePods(t *testing.T, objs ...runtime.Object) corev1client.CoreV1Interface {
	scheme := runtime.NewScheme()
	require.NoError(t, corev1.AddToScheme(scheme))
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	tracker := k8stesting.NewObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder())
	for _, o := range objs {
		require.NoError(t, tracker.Add(o))
	}
	f := &k8stesting.Fake{}
	f.AddReactor("*", "*", k8stesting.ObjectReaction(tracker))
	f.AddWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := tracker.Watch(a.GetResource(), a.GetNamespace())
		return true, w, err
	})
	return fakeCore{&corev1fake.FakeCoreV1{Fake: f}}
}

// fakeCore tells informers that the fake cannot stream lists.
type fakeCore struct{ *corev1fake.FakeCoreV1 }

func (fakeCore) IsWatchListSemanticsUnSupported() bool { return true }

func TestWatcherFollowsPods(t *testing.T) {
	vllm := map[string]string{"app": "vllm"}
	cs := fakePods(t,
		pod("a", "10.0.0.1", true, vllm, map[string]string{kube.AnnotationEvents: "5557", kube.AnnotationReplay: "5558", kube.AnnotationEngine: "vllm"}),
		pod("b", "10.0.0.2", false, vllm, nil),
		pod("other", "10.0.0.9", true, map[string]string{"app": "web"}, nil),
	)
	r, err := router.New(router.Config{})
	require.NoError(t, err)
	eps := &epp.Endpoints{}
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, Addresses: eps})
	require.NoError(t, err)
	defer pool.Close()
	rec := &recorder{}
	w := &kube.Watcher{Client: cs, Namespace: "ns", Selector: "app=vllm", TargetPorts: []int{8000}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, sinks{pool, rec}) }()
	wait := func(want string) {
		t.Helper()
		require.Eventually(t, func() bool { return rec.ready() == want }, 10*time.Second, 5*time.Millisecond, "want %q, have %q", want, rec.ready())
	}
	wait("ns/a")
	idA := discovery.WorkerIDOf("ns/a")
	require.Equal(t, []kvroute.WorkerKey{{ID: idA}}, r.Workers())
	addr, _ := eps.Address(kvroute.WorkerKey{ID: idA})
	require.Equal(t, "10.0.0.1:8000", addr)
	a := pool.Members()[0]
	require.Equal(t, "tcp://10.0.0.1:5557", a.Events)
	require.Equal(t, "tcp://10.0.0.1:5558", a.Replay)
	require.Equal(t, "http://10.0.0.1:8000/metrics", a.Metrics)

	// b becomes ready; a two-rank pod arrives.
	pods := cs.Pods("ns")
	_, err = pods.UpdateStatus(ctx, pod("b", "10.0.0.2", true, vllm, nil), metav1.UpdateOptions{})
	require.NoError(t, err)
	_, err = pods.Create(ctx, pod("c", "10.0.0.3", true, vllm, map[string]string{kube.AnnotationRanks: "2", kube.AnnotationMetrics: "9100"}), metav1.CreateOptions{})
	require.NoError(t, err)
	wait("ns/a,ns/b,ns/c")
	require.Len(t, r.Workers(), 4, "a, b and c's two ranks")
	addr, _ = eps.Address(kvroute.WorkerKey{ID: discovery.WorkerIDOf("ns/c"), Rank: 1})
	require.Equal(t, "10.0.0.3:8001", addr)

	// c's annotations go bad while it is ready: it keeps its last valid
	// description (d, created after, shows the change was seen).
	_, err = pods.Update(ctx, pod("c", "10.0.0.3", true, vllm, map[string]string{kube.AnnotationRanks: "x", kube.AnnotationMetrics: "9100"}), metav1.UpdateOptions{})
	require.NoError(t, err)
	_, err = pods.Create(ctx, pod("d", "10.0.0.4", true, vllm, nil), metav1.CreateOptions{})
	require.NoError(t, err)
	wait("ns/a,ns/b,ns/c,ns/d")
	require.Len(t, r.Workers(), 5, "a, b, c's two ranks and d")
	require.NoError(t, pods.Delete(ctx, "d", metav1.DeleteOptions{}))
	wait("ns/a,ns/b,ns/c")

	// a goes away, b is not ready any more.
	require.NoError(t, pods.Delete(ctx, "a", metav1.DeleteOptions{}))
	_, err = pods.UpdateStatus(ctx, pod("b", "10.0.0.2", false, vllm, nil), metav1.UpdateOptions{})
	require.NoError(t, err)
	wait("ns/c")
	require.Len(t, r.Workers(), 2)
	_, ok := eps.Address(kvroute.WorkerKey{ID: idA})
	require.False(t, ok)

	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

func TestEngineAnnotations(t *testing.T) {
	_, err := (&kube.Watcher{}).Engine(pod("p", "10.1.1.1", true, nil, nil))
	require.ErrorIs(t, err, discovery.ErrEngine, "a watcher without target ports")
	w := &kube.Watcher{TargetPorts: []int{8000, 8001}, EventsPort: 5557}
	e, err := w.Engine(pod("p", "10.1.1.1", true, nil, map[string]string{kube.AnnotationTopic: "kv"}))
	require.NoError(t, err)
	require.Equal(t, discovery.Engine{Name: "ns/p", Host: "10.1.1.1", Ports: []int{8000, 8001}, Ready: true,
		Events: "tcp://10.1.1.1:5557", Topic: "kv", Metrics: "http://10.1.1.1:8000/metrics"}, e)
	for _, bad := range []map[string]string{
		{kube.AnnotationEvents: "x"}, {kube.AnnotationRanks: "2"}, {kube.AnnotationEngine: "tgi"},
	} {
		_, err := w.Engine(pod("p", "10.1.1.1", true, nil, bad))
		require.ErrorIs(t, err, discovery.ErrEngine, bad)
	}
	notReady := pod("p", "", true, nil, nil)
	e, err = w.Engine(notReady)
	require.NoError(t, err)
	require.False(t, e.Ready, "no IP yet")
	require.False(t, kube.Ready(pod("p", "10.1.1.1", false, nil, nil)))
}

func TestPoolSpec(t *testing.T) {
	ip := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "llama", "namespace": "ns"},
		"spec": map[string]any{
			"selector":    map[string]any{"matchLabels": map[string]any{"app": "vllm-llama"}},
			"targetPorts": []any{map[string]any{"number": int64(8000)}, map[string]any{"number": int64(8001)}},
		},
	}}
	broken := ip.DeepCopy()
	broken.SetName("broken")
	unstructured.RemoveNestedField(broken.Object, "spec", "targetPorts")
	scheme := runtime.NewScheme()
	dc := dynfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{kube.InferencePoolResource: "InferencePoolList"}, ip, broken)
	sel, ports, err := kube.PoolSpec(context.Background(), dc, "ns", "llama")
	require.NoError(t, err)
	require.Equal(t, "app=vllm-llama", sel)
	require.Equal(t, []int{8000, 8001}, ports)
	_, _, err = kube.PoolSpec(context.Background(), dc, "ns", "broken")
	require.ErrorIs(t, err, kube.ErrConfig)
	_, _, err = kube.PoolSpec(context.Background(), dc, "ns", "missing")
	require.Error(t, err)
}
