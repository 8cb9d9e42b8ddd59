package e2e

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The webhook as the chart registers it (TLS with the chart's CA,
// failurePolicy Fail), called by the real API server on pod CREATE: its
// answer must be one the server accepts and applies (the patch encoding,
// after the server's own defaulting), and it does what docs/scheduler.md
// says. No kube-scheduler is needed for this: pods stay Pending.
func TestWebhook(t *testing.T) {
	s := startStack(t, 1)
	ctx := context.Background()
	pods := cp.cs.CoreV1().Pods("default")

	t.Run("GPU pod is mutated", func(t *testing.T) {
		// Not scheduled by anyone here: a node selector nothing matches.
		p := gpuPod("wh-gpu", 1024, 30)
		p.Spec.NodeSelector = map[string]string{"e2e": "never"}
		got, err := pods.Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create through the webhook: %v\n%s", err, s.sched.tail())
		}
		defer cp.forceDeletePods(t, "default", got.Name)
		if got.Spec.SchedulerName != "hami-scheduler" {
			t.Errorf("schedulerName %q, want hami-scheduler (the API server defaulted default-scheduler first)", got.Spec.SchedulerName)
		}
		c := got.Spec.Containers[0]
		if q := c.Resources.Limits["nvidia.com/gpu"]; q.Value() != 1 {
			t.Errorf("nvidia.com/gpu limit %v, want 1 (memory and cores imply one GPU)", c.Resources.Limits)
		}
		if !hasEnv(c, "CUDA_TASK_PRIORITY", "1") {
			t.Errorf("env %v lacks CUDA_TASK_PRIORITY=1", c.Env)
		}
	})

	t.Run("a whole card is exclusive", func(t *testing.T) {
		p := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "wh-whole", Namespace: "default"},
			Spec: v1.PodSpec{
				NodeSelector: map[string]string{"e2e": "never"},
				Containers: []v1.Container{{Name: "main", Image: "cuda", Resources: v1.ResourceRequirements{
					Limits: v1.ResourceList{"nvidia.com/gpu": resourceQ(1)},
				}}},
			},
		}
		got, err := pods.Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer cp.forceDeletePods(t, "default", got.Name)
		if q := got.Spec.Containers[0].Resources.Limits["nvidia.com/gpucores"]; q.Value() != 100 {
			t.Errorf("nvidia.com/gpu alone (the whole card): gpucores %v, want 100", got.Spec.Containers[0].Resources.Limits)
		}
	})

	t.Run("non-GPU pod is left alone", func(t *testing.T) {
		p := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "wh-cpu", Namespace: "default"},
			Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "main", Image: "busybox"}}},
		}
		got, err := pods.Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer cp.forceDeletePods(t, "default", got.Name)
		if got.Spec.SchedulerName != "default-scheduler" || len(got.Spec.Containers[0].Env) != 0 {
			t.Errorf("mutated: schedulerName %q env %v", got.Spec.SchedulerName, got.Spec.Containers[0].Env)
		}
	})

	t.Run("hami.io/webhook ignore is left alone", func(t *testing.T) {
		p := gpuPod("wh-ignored", 1024, 30)
		p.Labels = map[string]string{"hami.io/webhook": "ignore"}
		got, err := pods.Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer cp.forceDeletePods(t, "default", got.Name)
		c := got.Spec.Containers[0]
		if got.Spec.SchedulerName != "default-scheduler" || len(c.Env) != 0 {
			t.Errorf("mutated: schedulerName %q env %v", got.Spec.SchedulerName, c.Env)
		}
		if _, ok := c.Resources.Limits["nvidia.com/gpu"]; ok {
			t.Errorf("nvidia.com/gpu added to an ignored pod: %v", c.Resources.Limits)
		}
	})

	t.Run("privileged GPU pod is refused", func(t *testing.T) {
		p := gpuPod("wh-privileged", 1024, 30)
		yes := true
		p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: &yes}
		_, err := pods.Create(ctx, p, metav1.CreateOptions{})
		if err == nil {
			cp.forceDeletePods(t, "default", p.Name)
			t.Fatal("a privileged GPU pod was admitted")
		}
		if !strings.Contains(err.Error(), "denied the request") {
			t.Errorf("refused, but not by the webhook's answer: %v", err)
		}
	})
}

func hasEnv(c v1.Container, k, v string) bool {
	for _, e := range c.Env {
		if e.Name == k && e.Value == v {
			return true
		}
	}
	return false
}
