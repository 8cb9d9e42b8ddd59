// Package kubeletnode is what the e2e kubelet stand-ins (cmd/devicemanager,
// cmd/drakubelet) share: registering the Node as a kubelet does.
package kubeletnode

import (
	"context"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Register creates the Node (labels as k=v,k2=v2), Ready, with a kubelet's
// base resources, and lifts the not-ready taint the API server put on it.
// message is the Ready condition's message (which stand-in this is).
func Register(ctx context.Context, cs kubernetes.Interface, name, labels, message string) error {
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status: v1.NodeStatus{
			Capacity:    BaseResources(),
			Allocatable: BaseResources(),
			Conditions: []v1.NodeCondition{{
				Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
				Message: message, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
			}},
		},
	}
	for _, kv := range strings.Split(labels, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			n.Labels[k] = v
		}
	}
	_, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	// The API server's TaintNodesByCondition admission taints a new Node
	// not-ready; the node lifecycle controller lifts it once the kubelet's
	// Ready heartbeats arrive. No heartbeats here (and no such controller):
	// lift it as that controller would for a Ready node.
	cur, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var keep []v1.Taint
	for _, t := range cur.Spec.Taints {
		if t.Key != v1.TaintNodeNotReady {
			keep = append(keep, t)
		}
	}
	if len(keep) != len(cur.Spec.Taints) {
		cur.Spec.Taints = keep
		_, err = cs.CoreV1().Nodes().Update(ctx, cur, metav1.UpdateOptions{})
	}
	return err
}

// BaseResources is the CPU, memory and pod capacity every stand-in node has.
func BaseResources() v1.ResourceList {
	return v1.ResourceList{
		v1.ResourceCPU:    resource.MustParse("16"),
		v1.ResourceMemory: resource.MustParse("64Gi"),
		v1.ResourcePods:   resource.MustParse("110"),
	}
}
