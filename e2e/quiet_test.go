package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A node agent that rewrites its Node while nothing about the devices
// changed costs every watcher of Nodes (kube-scheduler, every controller)
// a full object per write, on every GPU node. Over 60 s of steady busy
// load — a pod's process holding memory and launching kernels — `vgpu
// node` must write its Node zero times, counted in the real API server's
// audit log (every create/update/patch of nodes and nodes/status by its
// ServiceAccount). The scheduler's handshake runs at the chart's period.
//
// Before the fix, at 1.37.2, the agent answered every `Requesting_`
// handshake with a patch: 4 writes in 60 s at the 15 s handshake period
// although nothing changed.
func TestQuietAPIUnderSteadyLoad(t *testing.T) {
	// The chart's register interval would hide a periodic writer behind
	// 30 s; 1 s makes one show up.
	s := startStack(t, 1, "--register-interval", "1s")
	ctx := context.Background()
	p, err := cp.cs.CoreV1().Pods("default").Create(ctx, gpuPod("busy", 2048, 50), metav1.CreateOptions{})
	must(t, err)
	_, a := waitBound(t, s, p.Name)
	if a.Error != "" {
		t.Fatal(a.Error)
	}
	w := startWorker(t, s, workerEnv(t, dmView(a.Containers[0].Options)),
		"init", "ctx", "0", "alloc", "1024", "ready", "launch", "200", "264", "80000", "ready", "wait")
	w.expect(t, "ready", 60*time.Second)
	// Let the agent see the new process and its memory once.
	time.Sleep(10 * time.Second)
	user := "system:serviceaccount:" + releaseNS + ":" + nodeSA
	n0, _ := cp.auditWrites(user)
	if n0 == 0 {
		// It registered its devices on the Node at start: the count sees
		// nothing, so it would prove nothing.
		t.Fatalf("the audit log shows no Node write by %s at all", user)
	}
	time.Sleep(60 * time.Second)
	n1, lines := cp.auditWrites(user)
	if s.agent.exited() {
		t.Fatalf("vgpu node exited\n%s", s.agent.tail())
	}
	if n1 != n0 {
		var verbs []string
		for _, l := range lines[n0:] {
			if _, rest, ok := strings.Cut(l, `"verb":"`); ok {
				v, _, _ := strings.Cut(rest, `"`)
				if _, r2, ok := strings.Cut(l, `"requestURI":"`); ok {
					u, _, _ := strings.Cut(r2, `"`)
					v += " " + u
				}
				verbs = append(verbs, v)
			}
		}
		t.Errorf("vgpu node wrote its Node %d times in 60 s of steady load with no device change: %q", n1-n0, verbs)
	}
}
