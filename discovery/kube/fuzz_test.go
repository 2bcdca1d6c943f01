package kube_test

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/kube"
	"github.com/kvroute/kvroute/router"
)

// FuzzPodEngine reads a ready pod's annotations as the watcher does. A
// rejected pod wraps discovery.ErrEngine; an accepted one is a valid engine
// with at most router.MaxDataParallelRanks ports, and no annotation makes
// the watcher allocate more than that.
func FuzzPodEngine(f *testing.F) {
	f.Add("10.0.0.7", "5557", "tcp://10.0.0.7:5558", "kv-events", "9090", "vllm", "2")
	f.Add("10.0.0.8", "", "", "", "", "sglang", "")
	f.Add("10.0.0.9", "x", "0", "", "http://m/metrics", "tgi", "1000000000")
	f.Add("::1", "tcp://[::1]:5557", "", "", "", "", "-1")
	f.Fuzz(func(t *testing.T, ip, events, replay, topic, metrics, engine, ranks string) {
		ann := map[string]string{}
		for k, v := range map[string]string{kube.AnnotationEvents: events, kube.AnnotationReplay: replay,
			kube.AnnotationTopic: topic, kube.AnnotationMetrics: metrics, kube.AnnotationEngine: engine, kube.AnnotationRanks: ranks} {
			if v != "" {
				ann[k] = v
			}
		}
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "engine-0", Annotations: ann},
			Status: corev1.PodStatus{PodIP: ip, Phase: corev1.PodRunning,
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
		w := &kube.Watcher{TargetPorts: []int{8000}, EventsPort: 5557}
		e, err := w.Engine(p)
		if len(e.Ports) > router.MaxDataParallelRanks {
			t.Fatalf("%d ports built", len(e.Ports))
		}
		if err != nil {
			if !errors.Is(err, discovery.ErrEngine) {
				t.Fatalf("error %q does not wrap discovery.ErrEngine", err)
			}
			return
		}
		if !e.Ready {
			return
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("accepted invalid engine %+v: %v", e, err)
		}
	})
}
