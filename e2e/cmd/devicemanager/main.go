// Command devicemanager is the kubelet side of the e2e tests: the kubelet's
// own device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager, the
// release pinned in go.mod) driven the way the kubelet drives it, around a
// Node it registers and the pods bound to it.
//
//   - It registers the Node (labels from --node-labels) as a kubelet does,
//     and publishes the device manager's GetCapacity into the Node's
//     capacity and allocatable whenever they change.
//   - It watches the pods bound to the node and admits each, one at a time
//     (the kubelet admits serially): Allocate for every init container then
//     every app container, then GetDeviceRunContainerOptions per container
//     (what the runtime is given). A refused admission fails the pod
//     (phase Failed, reason UnexpectedAdmissionError), as the kubelet does.
//   - POST /restart is a kubelet restart: Stop, a new manager, Start with
//     the admitted containers as running (the real checkpoint is re-read).
//
// The registration socket is fixed at /var/lib/kubelet/device-plugins: run
// it in a private mount namespace with a tmpfs there.
//
// HTTP on --listen (loopback): GET /pods/<uid> (the admission's outcome),
// POST /pods/<uid>/options (GetDeviceRunContainerOptions again, now),
// GET /capacity, POST /restart, GET /healthz. It prints
// "devicemanager: listening on http://ADDR" on stdout once serving.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	"vgpu.test/e2e/internal/kubeletnode"
)

// ContainerResult is one container's DeviceRunContainerOptions.
type ContainerResult struct {
	Name    string                                   `json:"name"`
	Options *devicemanager.DeviceRunContainerOptions `json:"options"`
}

// Admission is the outcome of admitting one pod.
type Admission struct {
	Namespace  string            `json:"namespace"`
	Name       string            `json:"name"`
	Error      string            `json:"error,omitempty"`
	Containers []ContainerResult `json:"containers,omitempty"`
}

type driver struct {
	cs     kubernetes.Interface
	node   string
	logger klog.Logger

	mu      sync.Mutex // serializes the manager's calls (the kubelet's sync loop)
	m       *devicemanager.ManagerImpl
	amu     sync.Mutex            // guards active and seen: the manager reads active from inside Allocate
	active  map[types.UID]*v1.Pod // admitted (or being admitted), not deleted
	results map[types.UID]*Admission
	queue   chan *v1.Pod
	seen    sets.Set[types.UID]
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	node := flag.String("node-name", "", "the Node this kubelet is")
	labels := flag.String("node-labels", "", "k=v,k2=v2 labels of the Node")
	listen := flag.String("listen", "127.0.0.1:0", "HTTP address (loopback)")
	klog.InitFlags(nil)
	flag.Parse()
	if *kubeconfig == "" || *node == "" {
		fmt.Fprintln(os.Stderr, "devicemanager: --kubeconfig and --node-name are required")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	must(err)
	d := &driver{
		cs:      kubernetes.NewForConfigOrDie(cfg),
		node:    *node,
		logger:  klog.Background(),
		active:  map[types.UID]*v1.Pod{},
		results: map[types.UID]*Admission{},
		queue:   make(chan *v1.Pod, 1024),
		seen:    sets.New[types.UID](),
	}
	ctx := context.Background()
	must(d.registerNode(ctx, *labels))
	must(d.start(nil))
	go d.publishCapacity(ctx)
	go d.admitLoop(ctx)
	d.watchPods(ctx)

	ln, err := net.Listen("tcp", *listen)
	must(err)
	fmt.Printf("devicemanager: listening on http://%s\n", ln.Addr())
	must(http.Serve(ln, d.routes()))
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "devicemanager:", err)
		os.Exit(1)
	}
}

// start creates and starts a device manager, as the kubelet's container
// manager does (no topology: a fake topology manager, policy none).
// running lists the containers the runtime reports running (a restart).
func (d *driver) start(running map[types.UID]*Admission) error {
	m, err := devicemanager.NewManagerImpl(d.logger, nil, topologymanager.NewFakeManager(d.logger))
	if err != nil {
		return err
	}
	cm := containermap.NewContainerMap()
	ids := sets.New[string]()
	for uid, a := range running {
		for _, c := range a.Containers {
			id := fmt.Sprintf("%s-%s", uid, c.Name)
			cm.Add(string(uid), c.Name, id)
			ids.Insert(id)
		}
	}
	ready := config.NewSourcesReady(func(sets.Set[string]) bool { return true })
	if err := m.Start(d.logger, d.activePods, ready, cm, ids); err != nil {
		return err
	}
	d.m = m
	return nil
}

func (d *driver) activePods() []*v1.Pod {
	d.amu.Lock()
	defer d.amu.Unlock()
	out := make([]*v1.Pod, 0, len(d.active))
	for _, p := range d.active {
		out = append(out, p)
	}
	return out
}

func (d *driver) setActive(p *v1.Pod, on bool) {
	d.amu.Lock()
	defer d.amu.Unlock()
	if on {
		d.active[p.UID] = p
	} else {
		delete(d.active, p.UID)
	}
}

func (d *driver) registerNode(ctx context.Context, labels string) error {
	return kubeletnode.Register(ctx, d.cs, d.node, labels, "e2e device-manager driver")
}

// publishCapacity mirrors the kubelet's node status setter for device
// plugin resources: capacity and allocatable from GetCapacity, removed
// resources dropped; written only on change.
func (d *driver) publishCapacity(ctx context.Context) {
	var last string
	for {
		d.mu.Lock()
		c, a, removed := d.m.GetCapacity(d.logger)
		d.mu.Unlock()
		capacity, alloc := map[string]any{}, map[string]any{}
		for k, v := range c {
			capacity[string(k)] = v.String()
		}
		for k, v := range a {
			alloc[string(k)] = v.String()
		}
		for _, r := range removed {
			capacity[r], alloc[r] = nil, nil
		}
		body, _ := json.Marshal(map[string]any{"status": map[string]any{"capacity": capacity, "allocatable": alloc}})
		if string(body) != last {
			_, err := d.cs.CoreV1().Nodes().PatchStatus(ctx, d.node, body)
			if err != nil {
				d.logger.Error(err, "node status")
			} else {
				last = string(body)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (d *driver) watchPods(ctx context.Context) {
	f := informers.NewSharedInformerFactoryWithOptions(d.cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", d.node).String()
	}))
	inf := f.Core().V1().Pods().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { d.podSeen(o.(*v1.Pod)) },
		UpdateFunc: func(_, o any) { d.podSeen(o.(*v1.Pod)) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if p, ok := o.(*v1.Pod); ok {
				d.setActive(p, false)
			}
		},
	})
	must(err)
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
}

func (d *driver) podSeen(p *v1.Pod) {
	if p.DeletionTimestamp != nil || p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodSucceeded {
		return
	}
	// amu, not mu: the informer must not wait for an admission in flight.
	d.amu.Lock()
	fresh := !d.seen.Has(p.UID)
	d.seen.Insert(p.UID)
	d.amu.Unlock()
	if fresh {
		d.queue <- p.DeepCopy()
	}
}

func (d *driver) admitLoop(ctx context.Context) {
	for p := range d.queue {
		a := d.admit(ctx, p)
		if a.Error != "" {
			d.failPod(ctx, p, a.Error)
		}
	}
}

// admit is the kubelet's admission and container start for one pod.
func (d *driver) admit(ctx context.Context, p *v1.Pod) *Admission {
	d.mu.Lock()
	defer d.mu.Unlock()
	a := &Admission{Namespace: p.Namespace, Name: p.Name}
	d.setActive(p, true)
	all := append(append([]v1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...)
	for i := range all {
		if err := d.m.Allocate(ctx, p, &all[i], lifecycle.AddOperation); err != nil {
			a.Error = fmt.Sprintf("Allocate %s: %v", all[i].Name, err)
			d.setActive(p, false)
			d.results[p.UID] = a
			return a
		}
	}
	// The runtime gets each container's options at its start (here: now).
	d.runOptions(ctx, p, a)
	d.results[p.UID] = a
	return a
}

func (d *driver) runOptions(ctx context.Context, p *v1.Pod, a *Admission) {
	a.Containers = nil
	all := append(append([]v1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...)
	for i := range all {
		o, err := d.m.GetDeviceRunContainerOptions(ctx, p, &all[i])
		if err != nil {
			a.Error = fmt.Sprintf("GetDeviceRunContainerOptions %s: %v", all[i].Name, err)
			return
		}
		a.Containers = append(a.Containers, ContainerResult{Name: all[i].Name, Options: o})
	}
}

func (d *driver) failPod(ctx context.Context, p *v1.Pod, msg string) {
	st := map[string]any{"status": map[string]any{
		"phase": "Failed", "reason": "UnexpectedAdmissionError",
		"message": "Allocate failed due to " + msg,
	}}
	body, _ := json.Marshal(st)
	_, err := d.cs.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, body, metav1.PatchOptions{}, "status")
	if err != nil {
		d.logger.Error(err, "fail pod", "pod", klog.KObj(p))
	}
}

func (d *driver) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /pods/{uid}", func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		a, ok := d.results[types.UID(r.PathValue("uid"))]
		d.mu.Unlock()
		if !ok {
			http.Error(w, "not admitted yet", http.StatusNotFound)
			return
		}
		writeJSON(w, a)
	})
	mux.HandleFunc("POST /pods/{uid}/options", func(w http.ResponseWriter, r *http.Request) {
		uid := types.UID(r.PathValue("uid"))
		d.mu.Lock()
		defer d.mu.Unlock()
		d.amu.Lock()
		p, ok := d.active[uid]
		d.amu.Unlock()
		if !ok {
			http.Error(w, "no such active pod", http.StatusNotFound)
			return
		}
		a := &Admission{Namespace: p.Namespace, Name: p.Name}
		d.runOptions(r.Context(), p, a)
		writeJSON(w, a)
	})
	mux.HandleFunc("GET /capacity", func(w http.ResponseWriter, _ *http.Request) {
		d.mu.Lock()
		c, a, removed := d.m.GetCapacity(d.logger)
		d.mu.Unlock()
		writeJSON(w, map[string]any{"capacity": c, "allocatable": a, "removed": removed})
	})
	mux.HandleFunc("POST /restart", func(w http.ResponseWriter, _ *http.Request) {
		d.mu.Lock()
		defer d.mu.Unlock()
		if err := d.m.Stop(d.logger); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		running := map[types.UID]*Admission{}
		for uid, a := range d.results {
			d.amu.Lock()
			_, ok := d.active[uid]
			d.amu.Unlock()
			if ok && a.Error == "" {
				running[uid] = a
			}
		}
		if err := d.start(running); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "restarted")
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil && !errors.Is(err, http.ErrHandlerTimeout) {
		fmt.Fprintln(os.Stderr, "devicemanager: write:", err)
	}
}
