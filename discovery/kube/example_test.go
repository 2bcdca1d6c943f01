package kube_test

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/discovery/kube"
)

func ExampleWatcher_Engine() {
	w := &kube.Watcher{TargetPorts: []int{8000}}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vllm-0", Annotations: map[string]string{
			kube.AnnotationEvents: "5557", kube.AnnotationReplay: "5558", kube.AnnotationRanks: "2"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	e, err := w.Engine(p)
	if err != nil {
		panic(err)
	}
	fmt.Println(e.Name, e.Ready, e.Ports, e.Events, e.Replay, e.Metrics)
	// Output: default/vllm-0 true [8000 8001] tcp://10.0.0.7:5557 tcp://10.0.0.7:5558 http://10.0.0.7:8000/metrics
}
