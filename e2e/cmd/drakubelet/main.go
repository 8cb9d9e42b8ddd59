// Command drakubelet is the kubelet's DRA side for the e2e tests: the
// kubelet's own plugin manager (k8s.io/kubernetes/pkg/kubelet/pluginmanager)
// and DRA manager (pkg/kubelet/cm/dra, the release pinned in go.mod) driven
// the way the kubelet drives them, around a Node it registers and the pods
// bound to it.
//
//   - It registers the Node (labels from --node-labels) as a kubelet does.
//   - The plugin manager watches --registry-dir with the DRA manager's
//     registration handler: a driver's registration socket there is
//     validated and registered as the kubelet does (GetInfo, the DRA
//     service versions, NotifyRegistrationStatus). The DRA manager keeps
//     its checkpoint in --state-dir.
//   - It watches the pods bound to the node and admits each, one at a
//     time: PrepareResources, then GetResources per init and app container
//     (the CDI device IDs the runtime would be given). A failed prepare is
//     recorded and retried with backoff (1 s doubling to 5 s), as the
//     kubelet's pod workers retry a pod sync; a deleted pod's claims are
//     unprepared (UnprepareResources, retried the same way).
//   - POST /restart is a kubelet restart: the plugin manager and the DRA
//     manager stop, a new DRA manager starts from the checkpoint (it wipes
//     the node's ResourceSlices at start, as the real one does) and a new
//     plugin manager walks the registry directory again.
//
// HTTP on --listen (loopback): GET /pods/<uid> (the admission's outcome),
// POST /pods/<uid>/resync (that pod synced again, now), GET /drivers/<name>
// (200 once the driver is registered), POST /restart, GET /healthz. It prints
// "drakubelet: listening on http://ADDR" on stdout once serving.
package main

import (
	"context"
	"encoding/json"
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
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"

	"vgpu.test/e2e/internal/kubeletnode"
)

// ContainerResult is one container's CDI device IDs from GetResources.
type ContainerResult struct {
	Name       string   `json:"name"`
	CDIDevices []string `json:"cdiDevices"`
}

// Admission is the outcome of admitting one pod so far.
type Admission struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Error is the last failed attempt's error; empty once prepared.
	Error string `json:"error,omitempty"`
	// Attempts counts PrepareResources calls (failed ones included).
	Attempts int `json:"attempts"`
	// PrepareMs is the successful PrepareResources call's duration.
	PrepareMs  float64           `json:"prepareMs,omitempty"`
	Prepared   bool              `json:"prepared"`
	Containers []ContainerResult `json:"containers,omitempty"`
	// Unprepared: the pod was deleted and UnprepareResources succeeded.
	Unprepared     bool   `json:"unprepared,omitempty"`
	UnprepareError string `json:"unprepareError,omitempty"`
}

type work struct {
	pod     *v1.Pod
	delete  bool
	backoff time.Duration
}

type kubelet struct {
	cs          kubernetes.Interface
	node        string
	registryDir string
	stateDir    string
	logger      klog.Logger

	mu     sync.Mutex // serializes the managers' calls (the kubelet's pod workers, one pod at a time here)
	m      *dra.Manager
	cancel context.CancelFunc // stops the current managers' generation
	stopPM chan struct{}

	amu     sync.Mutex // guards active, deleted, results: read by the DRA manager and the informer
	active  map[types.UID]*v1.Pod
	deleted sets.Set[types.UID]
	results map[types.UID]*Admission
	queue   chan work
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	node := flag.String("node-name", "", "the Node this kubelet is")
	labels := flag.String("node-labels", "", "k=v,k2=v2 labels of the Node")
	registryDir := flag.String("registry-dir", "", "the plugin registration directory (the kubelet's plugins_registry)")
	stateDir := flag.String("state-dir", "", "the DRA manager's checkpoint directory")
	listen := flag.String("listen", "127.0.0.1:0", "HTTP address (loopback)")
	klog.InitFlags(nil)
	flag.Parse()
	if *kubeconfig == "" || *node == "" || *registryDir == "" || *stateDir == "" {
		fmt.Fprintln(os.Stderr, "drakubelet: --kubeconfig, --node-name, --registry-dir and --state-dir are required")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	must(err)
	k := &kubelet{
		cs:          kubernetes.NewForConfigOrDie(cfg),
		node:        *node,
		registryDir: *registryDir,
		stateDir:    *stateDir,
		logger:      klog.Background(),
		active:      map[types.UID]*v1.Pod{},
		deleted:     sets.New[types.UID](),
		results:     map[types.UID]*Admission{},
		queue:       make(chan work, 4096),
	}
	ctx := context.Background()
	must(os.MkdirAll(*stateDir, 0o750))
	must(kubeletnode.Register(ctx, k.cs, k.node, *labels, "e2e DRA kubelet"))
	must(k.start())
	go k.workLoop(ctx)
	k.watchPods(ctx)

	ln, err := net.Listen("tcp", *listen)
	must(err)
	fmt.Printf("drakubelet: listening on http://%s\n", ln.Addr())
	must(http.Serve(ln, k.routes()))
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "drakubelet:", err)
		os.Exit(1)
	}
}

// start creates and starts a DRA manager and a plugin manager, in the
// order the kubelet does (container manager first, then the plugin
// manager with its registration handlers). Called with mu held (or
// before anything else runs).
func (k *kubelet) start() error {
	m, err := dra.NewManager(k.logger, k.cs, k.stateDir)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), k.logger))
	ready := config.NewSourcesReady(func(sets.Set[string]) bool { return true })
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return k.cs.CoreV1().Nodes().Get(ctx, k.node, metav1.GetOptions{})
	}
	if err := m.Start(ctx, k.activePods, getNode, ready); err != nil {
		cancel()
		return err
	}
	pm := pluginmanager.NewPluginManager(k.registryDir, record.NewFakeRecorder(100))
	pm.AddHandler(pluginwatcherapi.DRAPlugin, m.GetWatcherHandler())
	stop := make(chan struct{})
	go pm.Run(ctx, ready, stop)
	k.m, k.cancel, k.stopPM = m, cancel, stop
	return nil
}

func (k *kubelet) stop() {
	close(k.stopPM)
	k.cancel()
	k.m.Stop()
}

func (k *kubelet) activePods() []*v1.Pod {
	k.amu.Lock()
	defer k.amu.Unlock()
	out := make([]*v1.Pod, 0, len(k.active))
	for _, p := range k.active {
		out = append(out, p)
	}
	return out
}

func (k *kubelet) watchPods(ctx context.Context) {
	f := informers.NewSharedInformerFactoryWithOptions(k.cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", k.node).String()
	}))
	inf := f.Core().V1().Pods().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { k.podSeen(o.(*v1.Pod)) },
		UpdateFunc: func(_, o any) { k.podSeen(o.(*v1.Pod)) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if p, ok := o.(*v1.Pod); ok {
				k.podGone(p)
			}
		},
	})
	must(err)
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
}

func (k *kubelet) podSeen(p *v1.Pod) {
	if p.DeletionTimestamp != nil || p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodSucceeded {
		return
	}
	k.amu.Lock()
	_, known := k.active[p.UID]
	if !known && !k.deleted.Has(p.UID) {
		k.active[p.UID] = p.DeepCopy()
	}
	k.amu.Unlock()
	if !known {
		k.queue <- work{pod: p.DeepCopy(), backoff: time.Second}
	}
}

func (k *kubelet) podGone(p *v1.Pod) {
	k.amu.Lock()
	delete(k.active, p.UID)
	k.deleted.Insert(p.UID)
	k.amu.Unlock()
	k.queue <- work{pod: p.DeepCopy(), delete: true, backoff: time.Second}
}

func (k *kubelet) isDeleted(uid types.UID) bool {
	k.amu.Lock()
	defer k.amu.Unlock()
	return k.deleted.Has(uid)
}

func (k *kubelet) retry(w work) {
	next := min(2*w.backoff, 5*time.Second)
	time.AfterFunc(w.backoff, func() { k.queue <- work{pod: w.pod, delete: w.delete, backoff: next} })
}

func (k *kubelet) workLoop(ctx context.Context) {
	for w := range k.queue {
		if w.delete {
			if err := k.unprepare(ctx, w.pod); err != nil {
				k.retry(w)
			}
			continue
		}
		if k.isDeleted(w.pod.UID) {
			continue
		}
		if err := k.admit(ctx, w.pod); err != nil {
			k.retry(w)
		}
	}
}

func (k *kubelet) result(p *v1.Pod) *Admission {
	k.amu.Lock()
	defer k.amu.Unlock()
	a := k.results[p.UID]
	if a == nil {
		a = &Admission{Namespace: p.Namespace, Name: p.Name}
		k.results[p.UID] = a
	}
	return a
}

// admit is one pod sync up to the container starts: the claims prepared,
// then each container's CDI devices (what the runtime is given).
func (k *kubelet) admit(ctx context.Context, p *v1.Pod) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	a := k.result(p)
	t0 := time.Now()
	err := k.m.PrepareResources(ctx, p)
	took := time.Since(t0)
	k.amu.Lock()
	defer k.amu.Unlock()
	a.Attempts++
	if err != nil {
		a.Error = err.Error()
		k.logger.Error(err, "PrepareResources", "pod", klog.KObj(p), "attempt", a.Attempts)
		return err
	}
	var cs []ContainerResult
	all := append(append([]v1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...)
	for i := range all {
		info, err := k.m.GetResources(p, &all[i])
		if err != nil {
			a.Error = fmt.Sprintf("GetResources %s: %v", all[i].Name, err)
			return err
		}
		ids := []string{}
		for _, d := range info.CDIDevices {
			ids = append(ids, d.Name)
		}
		cs = append(cs, ContainerResult{Name: all[i].Name, CDIDevices: ids})
	}
	a.Error, a.Prepared, a.Containers = "", true, cs
	a.PrepareMs = float64(took.Microseconds()) / 1000
	return nil
}

func (k *kubelet) unprepare(ctx context.Context, p *v1.Pod) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	err := k.m.UnprepareResources(ctx, p)
	a := k.result(p)
	k.amu.Lock()
	defer k.amu.Unlock()
	if err != nil {
		a.UnprepareError = err.Error()
		k.logger.Error(err, "UnprepareResources", "pod", klog.KObj(p))
		return err
	}
	a.UnprepareError, a.Unprepared = "", true
	return nil
}

func (k *kubelet) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /pods/{uid}", func(w http.ResponseWriter, r *http.Request) {
		k.amu.Lock()
		a, ok := k.results[types.UID(r.PathValue("uid"))]
		var b []byte
		if ok {
			b, _ = json.Marshal(a)
		}
		k.amu.Unlock()
		if !ok {
			http.Error(w, "not admitted yet", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	})
	// A pod sync again, now (the kubelet syncs each pod periodically and
	// after its restart): PrepareResources (no driver call for claims the
	// checkpoint has prepared) and GetResources through the current manager.
	mux.HandleFunc("POST /pods/{uid}/resync", func(w http.ResponseWriter, r *http.Request) {
		k.amu.Lock()
		p, ok := k.active[types.UID(r.PathValue("uid"))]
		k.amu.Unlock()
		if !ok {
			http.Error(w, "no such active pod", http.StatusNotFound)
			return
		}
		err := k.admit(r.Context(), p)
		k.amu.Lock()
		b, _ := json.Marshal(k.results[p.UID])
		k.amu.Unlock()
		if err != nil {
			http.Error(w, string(b), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	})
	// Whether the DRA manager has the driver registered (what prepare needs).
	mux.HandleFunc("GET /drivers/{name}", func(w http.ResponseWriter, r *http.Request) {
		k.mu.Lock()
		pm, ok := k.m.GetWatcherHandler().(*draplugin.DRAPluginManager)
		k.mu.Unlock()
		if !ok {
			http.Error(w, "the DRA manager's handler is no DRAPluginManager", http.StatusInternalServerError)
			return
		}
		if _, err := pm.GetPlugin(r.PathValue("name")); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "registered")
	})
	mux.HandleFunc("POST /restart", func(w http.ResponseWriter, _ *http.Request) {
		k.mu.Lock()
		defer k.mu.Unlock()
		k.stop()
		if err := k.start(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "restarted")
	})
	return mux
}
