package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"sigs.k8s.io/yaml"
)

// vgpu's DRA mode against the real kube-apiserver, kube-controller-manager
// (the resourceclaim controller), kube-scheduler (its DynamicResources
// plugin does the capacity accounting) and the kubelet's own plugin
// manager and DRA manager (cmd/drakubelet) driving `vgpu node --mode dra`
// over its sockets; the CDI specs it writes applied to workers on the
// simulated GPU as a runtime would.

const (
	draDriver   = "vgpu.io"
	draNodeName = "dra-node-1"
)

// draDirs are a DRA node's host directories (the DaemonSet's hostPaths).
type draDirs struct{ registry, plugin, cdi, state string }

// enableDRA applies what the chart adds with dra.enabled=true (RBAC, the
// DeviceClass) and keeps the node DaemonSet's arguments of a DRA-only
// node (devicePlugin.enabled=false). Only those kinds: a second render
// makes a new webhook certificate, which the running scheduler does not
// serve.
func (s *stack) enableDRA(t *testing.T) {
	t.Helper()
	if s.draArgs != nil {
		return
	}
	var keep []*unstructured.Unstructured
	for _, o := range render(t, release, releaseNS, "--set", "dra.enabled=true") {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "DeviceClass":
			keep = append(keep, o)
		}
	}
	if find(keep, "DeviceClass", draDriver) == nil {
		t.Fatalf("the chart with dra.enabled=true renders no DeviceClass %s", draDriver)
	}
	apply(t, keep, false)
	if t.Failed() {
		t.FailNow()
	}
	// The RBAC just applied is deleted at cleanup: the processes using it
	// stop first (cleanups run last-first).
	t.Cleanup(s.stopProcs)
	objs := render(t, release, releaseNS, "--set", "dra.enabled=true", "--set", "devicePlugin.enabled=false")
	ds := find(objs, "DaemonSet", "vgpu-vgpu-node")
	if ds == nil {
		t.Fatal("the chart with dra.enabled=true,devicePlugin.enabled=false renders no node DaemonSet")
	}
	s.draArgs = stringsOf(containerOf(t, ds, "vgpu-node")["args"])
}

// addDRANode starts a DRA node on the stack's simulated machine: the
// kubelet's DRA side (cmd/drakubelet) and `vgpu node` with the chart's DRA
// arguments, its directories per node; it waits for the node's
// ResourceSlices to list devices GPUs.
func (s *stack) addDRANode(t *testing.T, name string, devices int) *gpuNode {
	t.Helper()
	s.enableDRA(t)
	dir := filepath.Join(s.dir, name)
	d := &draDirs{
		registry: filepath.Join(dir, "plugins_registry"),
		plugin:   filepath.Join(dir, "plugins", draDriver),
		cdi:      filepath.Join(dir, "cdi"),
		state:    filepath.Join(dir, "dra-state"),
	}
	hook, runDir := filepath.Join(dir, "hook"), filepath.Join(dir, "run-vgpu")
	for _, p := range []string{d.registry, d.plugin, d.cdi, d.state, hook, runDir} {
		must(t, os.MkdirAll(p, 0o755))
	}
	must(t, os.Chmod(s.dir, 0o755))
	must(t, os.Chmod(dir, 0o755))
	n := &gpuNode{s: s, name: name, dra: d}
	var err error
	n.dm, err = startProc(dir, "drakubelet", []string{peer("drakubelet"), "--kubeconfig=" + cp.adminKC,
		"--node-name=" + name, "--node-labels=gpu=on", "--registry-dir=" + d.registry, "--state-dir=" + d.state}, nil)
	must(t, err)
	// Stopped with the others (and its Node deleted) whatever happens next.
	s.more = append(s.more, n)
	if n.dmURL, err = n.dm.waitLine("drakubelet: listening on ", 60*time.Second); err != nil {
		t.Fatal(err)
	}
	set := map[string]string{
		"--hook-path":        hook,
		"--lib-path":         cargoBin("libvgpu.so"),
		"--broker-socket":    filepath.Join(runDir, "hostpid.sock"),
		"--metrics-addr":     "127.0.0.1:0",
		"--node-name":        name,
		"--kubeconfig":       cp.saKubeconfig(t, releaseNS, nodeSA),
		"--nvml-library":     filepath.Join(s.simDir, "lib/libnvidia-ml.so.1"),
		"--lock-dir":         filepath.Join(dir, "vgpulock"),
		"--dra-registry-dir": d.registry,
		"--dra-plugin-dir":   d.plugin,
		"--cdi-dir":          d.cdi,
	}
	args := s.draArgs
	if i := slices.IndexFunc(args, func(a string) bool { return a == "--mode" || strings.HasPrefix(a, "--mode=") }); i < 0 {
		t.Logf("the chart's DRA DaemonSet args name no --mode: --mode=dra added (%q)", args)
		set["--mode"] = "dra"
	} else if a := strings.Join(args[i:min(i+2, len(args))], "="); !strings.HasPrefix(a, "--mode=dra") {
		t.Errorf("the chart's DRA DaemonSet runs %q", a)
	}
	n.agentArgs = withFlags(args, set)
	n.startAgentEnv(t)
	n.waitDRAPlugin(t)
	n.waitRegistered(t)
	n.waitSlices(t, devices, 60*time.Second)
	return n
}

// waitRegistered waits for the kubelet's plugin manager to have registered
// the driver with the DRA manager (GetInfo on the registration socket,
// the service versions validated, NotifyRegistrationStatus).
func (n *gpuNode) waitRegistered(t *testing.T) {
	t.Helper()
	if err := waitFor(30*time.Second, "the kubelet to register "+draDriver, func() error {
		if n.agent.exited() {
			return stopWaiting{fmt.Errorf("vgpu node exited")}
		}
		b, err := scrape(nil, n.dmURL+"/drivers/"+draDriver)
		if err != nil {
			return err
		}
		if strings.TrimSpace(b) != "registered" {
			return fmt.Errorf("%s", strings.TrimSpace(b))
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\nthe kubelet's registration attempts:\n%s\n%s", err, grepLines(n.dm.output(), "RegisterPlugin"), n.agent.tail())
	}
}

func (n *gpuNode) waitDRAPlugin(t *testing.T) {
	t.Helper()
	sock, err := n.agent.waitLine("vgpu node: dra plugin on ", 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(n.dra.plugin, "dra.sock"); sock != want {
		t.Errorf("dra plugin on %q, want %q", sock, want)
	}
}

// slices is the node's ResourceSlices of the driver.
func (n *gpuNode) slices(ctx context.Context) ([]resourceapi.ResourceSlice, error) {
	l, err := cp.cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
		resourceapi.ResourceSliceSelectorNodeName: n.name, resourceapi.ResourceSliceSelectorDriver: draDriver,
	}.String()})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// waitSlices waits for the node's slices to list count devices.
func (n *gpuNode) waitSlices(t *testing.T, count int, timeout time.Duration) []resourceapi.ResourceSlice {
	t.Helper()
	var got []resourceapi.ResourceSlice
	if err := waitFor(timeout, fmt.Sprintf("%d devices in %s's ResourceSlices", count, n.name), func() error {
		if n.agent.exited() {
			return stopWaiting{fmt.Errorf("vgpu node exited")}
		}
		var err error
		if got, err = n.slices(context.Background()); err != nil {
			return err
		}
		devs := 0
		for _, s := range got {
			devs += len(s.Spec.Devices)
		}
		if devs != count {
			return fmt.Errorf("%d devices in %d slices", devs, len(got))
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s\n%s", err, n.agent.tail(), n.dm.tail())
	}
	return got
}

// draAdmission is cmd/drakubelet's outcome for a pod.
type draAdmission struct {
	Error      string  `json:"error"`
	Attempts   int     `json:"attempts"`
	PrepareMs  float64 `json:"prepareMs"`
	Prepared   bool    `json:"prepared"`
	Containers []struct {
		Name       string   `json:"name"`
		CDIDevices []string `json:"cdiDevices"`
	} `json:"containers"`
	Unprepared     bool   `json:"unprepared"`
	UnprepareError string `json:"unprepareError"`
}

func (n *gpuNode) draAdmission(uid string) (*draAdmission, error) {
	r, err := http.Get(n.dmURL + "/pods/" + uid)
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	if r.StatusCode != 200 {
		return nil, fmt.Errorf("HTTP %d: %s", r.StatusCode, b)
	}
	var a draAdmission
	return &a, json.Unmarshal(b, &a)
}

// ------------------------------------------------------------ the tests

// draEnv is what the DRA subtests share: one stack (a device-plugin node
// and a DRA node on one simulated GPU) and the latencies observed.
type draEnv struct {
	s         *stack
	n         *gpuNode
	schedName string
	gpu       resourceapi.Device // the slice's gpu-0

	mu        sync.Mutex
	created   map[string]time.Time // pod name → Create returned
	scheduled map[string]time.Duration
	waited    map[string]bool // found unschedulable first
	prepareMs []float64
}

func TestDRA(t *testing.T) {
	s := startStack(t, 1)
	n := s.addDRANode(t, draNodeName, 1)
	e := &draEnv{s: s, n: n, created: map[string]time.Time{}, scheduled: map[string]time.Duration{}, waited: map[string]bool{}}
	e.schedName = chartSchedulerName(t, s)
	sl := n.waitSlices(t, 1, time.Second)
	e.checkSlice(t, sl)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.observeScheduling(ctx)
	quietSince := time.Now()
	rewrites := e.observeSliceRewrites(ctx)

	t.Run("ThreeSharesAndAPendingFourth", e.testThreeShares)
	t.Run("WholeGPUAndRounding", e.testWholeAndRounding)
	t.Run("WorkerHeldToTheShare", e.testWorker)
	t.Run("MixedCluster", e.testMixed)
	t.Run("KubeletRestartAndDriverIdempotency", e.testRestartAndIdempotency)
	t.Run("DriverCrashBetweenPrepareSteps", e.testCrash)
	t.Run("TwoSharesInOneContainerRefused", e.testTwoShares)

	// Nothing about the GPU changed: its slice is never rewritten (a
	// rewrite bumps the pool generation: every scheduler recomputes). The
	// publisher's resync period is 30 s; watch past it.
	if d := 35*time.Second - time.Since(quietSince); d > 0 {
		time.Sleep(d)
	}
	e.mu.Lock()
	if len(*rewrites) > 0 {
		t.Errorf("%s's ResourceSlice rewritten %d times in %v with nothing changed, e.g. %s",
			e.n.name, len(*rewrites), time.Since(quietSince).Round(time.Second), (*rewrites)[0])
	}
	var alloc []float64
	for _, d := range e.scheduled {
		alloc = append(alloc, float64(d.Microseconds())/1000)
	}
	prep := append([]float64(nil), e.prepareMs...)
	e.mu.Unlock()
	a50, a99 := percentiles(alloc)
	p50, p99 := percentiles(prep)
	t.Logf("DRA latency: allocation_ms p50=%.1f p99=%.1f n=%d prepare_ms p50=%.1f p99=%.1f n=%d",
		a50, a99, len(alloc), p50, p99, len(prep))
	if len(alloc) == 0 || len(prep) == 0 {
		t.Errorf("no latencies recorded: %d allocations, %d prepares", len(alloc), len(prep))
	}
}

func percentiles(v []float64) (p50, p99 float64) {
	if len(v) == 0 {
		return 0, 0
	}
	sort.Float64s(v)
	at := func(q float64) float64 { return v[min(len(v)-1, int(q*float64(len(v))))] }
	return at(0.50), at(0.99)
}

func chartSchedulerName(t *testing.T, s *stack) string {
	t.Helper()
	cm := find(s.objs, "ConfigMap", "vgpu-vgpu-scheduler")
	text, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
	var cfg struct {
		Profiles []struct {
			SchedulerName string `json:"schedulerName"`
		} `json:"profiles"`
	}
	must(t, yaml.Unmarshal([]byte(text), &cfg))
	if len(cfg.Profiles) != 1 || cfg.Profiles[0].SchedulerName == "" {
		t.Fatalf("scheduler profiles %+v", cfg.Profiles)
	}
	return cfg.Profiles[0].SchedulerName
}

// checkSlice: the contract's ResourceSlice, as the API server kept it (a
// consumable-capacity field it dropped would show here).
func (e *draEnv) checkSlice(t *testing.T, sl []resourceapi.ResourceSlice) {
	t.Helper()
	if len(sl) != 1 || len(sl[0].Spec.Devices) != 1 {
		t.Fatalf("slices %+v", sl)
	}
	sp := sl[0].Spec
	if sp.Driver != draDriver || sp.Pool.Name != e.n.name || sp.NodeName == nil || *sp.NodeName != e.n.name {
		t.Errorf("slice driver %q pool %q nodeName %v", sp.Driver, sp.Pool.Name, sp.NodeName)
	}
	if o := sl[0].OwnerReferences; len(o) != 1 || o[0].Kind != "Node" || o[0].Name != e.n.name {
		t.Errorf("slice owners %+v, want the Node", o)
	}
	d := sp.Devices[0]
	e.gpu = d
	if d.Name != "gpu-0" || d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
		t.Errorf("device %s allowMultipleAllocations %v", d.Name, d.AllowMultipleAllocations)
	}
	mem, ok := d.Capacity["memory"]
	if !ok || mem.RequestPolicy == nil || mem.RequestPolicy.ValidRange == nil {
		t.Fatalf("memory capacity %+v: no request policy (dropped by the API server?)", mem)
	}
	v := mem.Value.Value()
	// vgpu-sim's default profile is an 80 GiB A100, rounded down to 1 Mi.
	if v%mib != 0 || v < 79<<30 || v > 80<<30 {
		t.Errorf("memory capacity %s", mem.Value.String())
	}
	r := mem.RequestPolicy.ValidRange
	if mem.RequestPolicy.Default == nil || mem.RequestPolicy.Default.Cmp(mem.Value) != 0 ||
		r.Min == nil || r.Min.Value() != mib || r.Step == nil || r.Step.Value() != mib || r.Max == nil || r.Max.Cmp(mem.Value) != 0 {
		t.Errorf("memory request policy %+v", mem.RequestPolicy)
	}
	cores, ok := d.Capacity["cores"]
	if !ok || cores.Value.Value() != 100 || cores.RequestPolicy == nil || cores.RequestPolicy.Default == nil ||
		cores.RequestPolicy.Default.Value() != 100 || cores.RequestPolicy.ValidRange == nil {
		t.Errorf("cores capacity %+v", cores)
	}
	if a, ok := d.Attributes["uuid"]; !ok || a.StringValue == nil || !strings.HasPrefix(*a.StringValue, "GPU-") {
		t.Errorf("uuid attribute %+v", d.Attributes)
	}
	if strings.Contains(e.n.agent.output(), "dropped consumable-capacity fields") {
		t.Errorf("vgpu node says the API server dropped consumable-capacity fields\n%s", e.n.agent.tail())
	}
}

// observeScheduling records, for each pod the tests create, how long after
// its creation the real scheduler's PodScheduled=True was seen.
func (e *draEnv) observeScheduling(ctx context.Context) {
	f := informers.NewSharedInformerFactoryWithOptions(cp.cs, 0, informers.WithNamespace("default"))
	inf := f.Core().V1().Pods().Informer()
	seen := func(o any) {
		p, ok := o.(*v1.Pod)
		if !ok {
			return
		}
		for _, c := range p.Status.Conditions {
			if c.Type != v1.PodScheduled {
				continue
			}
			now := time.Now()
			e.mu.Lock()
			switch t0, ok := e.created[p.Name]; {
			case !ok:
			case c.Status != v1.ConditionTrue:
				// Placed only once capacity was freed: how long the
				// test took to free it, not the scheduler.
				e.waited[p.Name] = true
			case !e.waited[p.Name]:
				if _, done := e.scheduled[p.Name]; !done {
					e.scheduled[p.Name] = now.Sub(t0)
				}
			}
			e.mu.Unlock()
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) }})
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
}

// observeSliceRewrites records each update of the DRA node's slices (not
// a creation after a wipe): the old and new pool generation and spec.
func (e *draEnv) observeSliceRewrites(ctx context.Context) *[]string {
	var out []string
	f := informers.NewSharedInformerFactoryWithOptions(cp.cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, e.n.name).String()
	}))
	inf := f.Resource().V1().ResourceSlices().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(old, cur any) {
		a, ok1 := old.(*resourceapi.ResourceSlice)
		b, ok2 := cur.(*resourceapi.ResourceSlice)
		if !ok1 || !ok2 || a.ResourceVersion == b.ResourceVersion {
			return
		}
		as, _ := json.Marshal(a.Spec)
		bs, _ := json.Marshal(b.Spec)
		e.mu.Lock()
		out = append(out, fmt.Sprintf("generation %d → %d\n  was %s\n  now %s", a.Spec.Pool.Generation, b.Spec.Pool.Generation, as, bs))
		e.mu.Unlock()
	}})
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	return &out
}

// createPod creates a ResourceClaimTemplate asking one vgpu.io device with
// capacity requests (none: nil) and a pod whose one container uses it.
func (e *draEnv) createPod(t *testing.T, name string, req map[string]string) {
	t.Helper()
	ctx := context.Background()
	er := &resourceapi.ExactDeviceRequest{DeviceClassName: draDriver}
	if req != nil {
		er.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		for k, v := range req {
			er.Capacity.Requests[resourceapi.QualifiedName(k)] = resource.MustParse(v)
		}
	}
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{
			Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: er}}},
		}},
	}
	if _, err := cp.cs.ResourceV1().ResourceClaimTemplates("default").Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatalf("ResourceClaimTemplate %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cp.cs.ResourceV1().ResourceClaimTemplates("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	tn := name
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.PodSpec{
			SchedulerName:  e.schedName,
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tn}},
			Containers: []v1.Container{{Name: "main", Image: "cuda",
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}},
		},
	}
	if _, err := cp.cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("pod %s: %v", name, err)
	}
	e.mu.Lock()
	e.created[name] = time.Now()
	e.mu.Unlock()
	t.Cleanup(func() { cp.forceDeletePods(t, "default", name) })
}

// waitScheduled waits for a pod bound to node.
func (e *draEnv) waitScheduled(t *testing.T, name, node string) *v1.Pod {
	t.Helper()
	var p *v1.Pod
	if err := waitFor(60*time.Second, "pod "+name+" bound", func() error {
		var err error
		if p, err = cp.cs.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			return err
		}
		if p.Spec.NodeName == "" {
			return fmt.Errorf("not bound; conditions %+v", p.Status.Conditions)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, e.s.ks.tail())
	}
	if p.Spec.NodeName != node {
		t.Fatalf("%s bound to %s, want %s", name, p.Spec.NodeName, node)
	}
	return p
}

// waitUnschedulable waits for the scheduler to mark a pod unschedulable
// and returns its message.
func (e *draEnv) waitUnschedulable(t *testing.T, name string) string {
	t.Helper()
	var msg string
	if err := waitFor(60*time.Second, "pod "+name+" unschedulable", func() error {
		p, err := cp.cs.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Spec.NodeName != "" {
			return stopWaiting{fmt.Errorf("bound to %s", p.Spec.NodeName)}
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable {
				msg = c.Message
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", p.Status.Conditions)
	}); err != nil {
		t.Fatalf("%v\n%s", err, e.s.ks.tail())
	}
	return msg
}

// claimOf is the pod's generated claim once allocated.
func (e *draEnv) claimOf(t *testing.T, name string) *resourceapi.ResourceClaim {
	t.Helper()
	var c *resourceapi.ResourceClaim
	if err := waitFor(30*time.Second, "the claim of "+name+" allocated", func() error {
		p, err := cp.cs.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(p.Status.ResourceClaimStatuses) != 1 || p.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
			return fmt.Errorf("claim statuses %+v", p.Status.ResourceClaimStatuses)
		}
		c, err = cp.cs.ResourceV1().ResourceClaims("default").Get(context.Background(), *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c.Status.Allocation == nil {
			return fmt.Errorf("not allocated")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

// share is the one allocation result of a claim, checked against the
// contract: our driver, the node's pool, gpu-0, a shareID.
type share struct {
	claim    *resourceapi.ResourceClaim
	shareID  string
	mem      resource.Quantity
	cores    resource.Quantity
	cdiID    string // the contract's CDI device ID for it
	specPath string
}

func (e *draEnv) shareOf(t *testing.T, name string) share {
	t.Helper()
	c := e.claimOf(t, name)
	rs := c.Status.Allocation.Devices.Results
	if len(rs) != 1 {
		t.Fatalf("%s: %d results %+v", name, len(rs), rs)
	}
	r := rs[0]
	if r.Driver != draDriver || r.Pool != e.n.name || r.Device != "gpu-0" || r.Request != "gpu" || r.ShareID == nil || *r.ShareID == "" {
		t.Fatalf("%s: allocation %+v", name, r)
	}
	sh := share{claim: c, shareID: string(*r.ShareID), mem: r.ConsumedCapacity["memory"], cores: r.ConsumedCapacity["cores"]}
	sh.cdiID = fmt.Sprintf("%s/claim=%s-gpu-0-%s", draDriver, c.UID, sh.shareID)
	sh.specPath = filepath.Join(e.n.dra.cdi, fmt.Sprintf("%s-claim_%s.json", draDriver, c.UID))
	return sh
}

// waitPrepared waits for cmd/drakubelet to have prepared a pod and checks
// its one container got the share's CDI device.
func (e *draEnv) waitPrepared(t *testing.T, p *v1.Pod, sh share, timeout time.Duration) *draAdmission {
	t.Helper()
	var a *draAdmission
	if err := waitFor(timeout, "kubelet prepare of "+p.Name, func() error {
		var err error
		if a, err = e.n.draAdmission(string(p.UID)); err != nil {
			return err
		}
		if !a.Prepared {
			return fmt.Errorf("not prepared after %d attempts: %s", a.Attempts, a.Error)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s\n%s", err, e.n.agent.tail(), e.n.dm.tail())
	}
	e.mu.Lock()
	e.prepareMs = append(e.prepareMs, a.PrepareMs)
	e.mu.Unlock()
	if len(a.Containers) != 1 || !slices.Contains(a.Containers[0].CDIDevices, sh.cdiID) {
		t.Errorf("%s: the runtime would get %+v, want %s among its CDI devices", p.Name, a.Containers, sh.cdiID)
	}
	return a
}

// runPod creates a pod, waits for it on the DRA node, allocated and
// prepared: its share and the container's view through the CDI spec.
func (e *draEnv) runPod(t *testing.T, name string, req map[string]string) (*v1.Pod, share, containerView) {
	t.Helper()
	e.createPod(t, name, req)
	p := e.waitScheduled(t, name, e.n.name)
	sh := e.shareOf(t, name)
	e.waitPrepared(t, p, sh, 60*time.Second)
	return p, sh, cdiView(t, readCDISpec(t, sh.specPath), sh.cdiID)
}

// checkLimits: the CDI env and the limits file say mem and cores.
func checkLimits(t *testing.T, v containerView, memMiB int64, cores int64) {
	t.Helper()
	if got, want := v.env["CUDA_DEVICE_MEMORY_LIMIT_0"], fmt.Sprintf("%dm", memMiB); got != want {
		t.Errorf("CUDA_DEVICE_MEMORY_LIMIT_0=%q, want %q (env %v)", got, want, v.env)
	}
	if got, want := v.env["CUDA_DEVICE_SM_LIMIT"], fmt.Sprint(cores); got != want {
		t.Errorf("CUDA_DEVICE_SM_LIMIT=%q, want %q", got, want)
	}
	lim, ok := toHost(v, "/etc/vgpu/limits")
	if !ok {
		t.Fatalf("no /etc/vgpu mount: %+v", v.mounts)
	}
	// The tenant controls its processes, not its limits.
	for _, m := range v.mounts {
		if m.containerPath == "/etc/vgpu" && !m.readOnly {
			t.Errorf("/etc/vgpu is mounted writable: %+v", m)
		}
	}
	b, err := os.ReadFile(lim)
	must(t, err)
	want := fmt.Sprintf("memory=%d", memMiB*mib)
	if !strings.Contains(string(b), want) || (cores < 100 && !strings.Contains(string(b), fmt.Sprintf("sm=%d", cores))) {
		t.Errorf("limits file %s:\n%s\nwant %s and sm=%d", lim, b, want, cores)
	}
}

// regionDir is the host directory of the share's region (where
// CUDA_DEVICE_MEMORY_SHARED_CACHE lives).
func regionDir(t *testing.T, v containerView) string {
	t.Helper()
	c := v.env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
	d, ok := toHost(v, filepath.Dir(c))
	if c == "" || !ok {
		t.Fatalf("CUDA_DEVICE_MEMORY_SHARED_CACHE=%q: no region mount in %+v", c, v.mounts)
	}
	if st, err := os.Stat(d); err != nil || !st.IsDir() {
		t.Fatalf("region directory %s: %v", d, err)
	}
	return d
}

// deletePods deletes pods and waits for their claims to be gone (the
// capacity back in the scheduler's hands) and, on the DRA node, their
// claims unprepared by the kubelet.
func (e *draEnv) deletePods(t *testing.T, names ...string) {
	t.Helper()
	ctx := context.Background()
	uids := map[string]string{}
	for _, n := range names {
		if p, err := cp.cs.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{}); err == nil && p.Spec.NodeName == e.n.name {
			uids[n] = string(p.UID)
		}
	}
	cp.forceDeletePods(t, "default", names...)
	if err := waitFor(60*time.Second, fmt.Sprintf("the claims of %v deleted", names), func() error {
		l, err := cp.cs.ResourceV1().ResourceClaims("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, c := range l.Items {
			for _, o := range c.OwnerReferences {
				if slices.Contains(names, o.Name) {
					return fmt.Errorf("claim %s of %s still there", c.Name, o.Name)
				}
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	for n, uid := range uids {
		if err := waitFor(30*time.Second, "kubelet unprepare of "+n, func() error {
			a, err := e.n.draAdmission(uid)
			if err != nil {
				return err
			}
			if !a.Unprepared {
				return fmt.Errorf("not unprepared: %q", a.UnprepareError)
			}
			return nil
		}); err != nil {
			t.Errorf("%v\n%s", err, e.n.dm.tail())
		}
	}
}

// Three pods of {8000Mi, 30 cores} share the GPU, each allocated exactly
// that with its own shareID and prepared by the kubelet; a fourth asking
// 30 cores more than is left stays Pending with the scheduler's reason;
// deleting one frees its share (its CDI spec and limits gone from the
// node) and the fourth is placed.
func (e *draEnv) testThreeShares(t *testing.T) {
	req := map[string]string{"memory": "8000Mi", "cores": "30"}
	names := []string{"share-a", "share-b", "share-c"}
	for _, n := range names {
		e.createPod(t, n, req)
	}
	ids := map[string]bool{}
	var first share
	var firstView containerView
	for i, n := range names {
		p := e.waitScheduled(t, n, e.n.name)
		sh := e.shareOf(t, n)
		if sh.mem.Cmp(resource.MustParse("8000Mi")) != 0 || sh.cores.Cmp(resource.MustParse("30")) != 0 {
			t.Errorf("%s consumed memory %s cores %s, want 8000Mi and 30", n, sh.mem.String(), sh.cores.String())
		}
		if ids[sh.shareID] {
			t.Errorf("%s: shareID %s given twice", n, sh.shareID)
		}
		ids[sh.shareID] = true
		e.waitPrepared(t, p, sh, 60*time.Second)
		v := cdiView(t, readCDISpec(t, sh.specPath), sh.cdiID)
		checkLimits(t, v, 8000, 30)
		if uuid := e.gpu.Attributes["uuid"].StringValue; uuid == nil || v.env["NVIDIA_VISIBLE_DEVICES"] != *uuid {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want the slice's uuid attribute", v.env["NVIDIA_VISIBLE_DEVICES"])
		}
		if i == 0 {
			first, firstView = sh, v
		}
	}
	e.createPod(t, "share-d", req)
	msg := e.waitUnschedulable(t, "share-d")
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("share-d unschedulable for %q, want the DRA plugin's reason", msg)
	}
	t.Logf("share-d pending: %s", msg)
	// Still pending a moment later (no retry placed it by mistake).
	time.Sleep(2 * time.Second)
	if p, err := cp.cs.CoreV1().Pods("default").Get(context.Background(), "share-d", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("share-d: %v bound to %q with 90 of 100 cores taken", err, p.Spec.NodeName)
	}

	limits, _ := toHost(firstView, "/etc/vgpu/limits")
	region := regionDir(t, firstView)
	e.deletePods(t, "share-a")
	for _, p := range []string{first.specPath, limits, region} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after share-a's unprepare: %v (want it removed)", p, err)
		}
	}
	p := e.waitScheduled(t, "share-d", e.n.name)
	sh := e.shareOf(t, "share-d")
	if sh.cores.Cmp(resource.MustParse("30")) != 0 || ids[sh.shareID] {
		t.Errorf("share-d consumed cores %s shareID %s (taken: %v)", sh.cores.String(), sh.shareID, ids)
	}
	e.waitPrepared(t, p, sh, 60*time.Second)
	e.deletePods(t, "share-b", "share-c", "share-d")
}

// No capacity asked: the whole GPU (the request policy's defaults). A
// byte over 8000Mi is rounded up to the next 1Mi step, in the allocation
// and in what the node enforces. More than the device: unschedulable.
func (e *draEnv) testWholeAndRounding(t *testing.T) {
	_, sh, v := e.runPod(t, "whole", nil)
	full := e.gpu.Capacity["memory"].Value
	if sh.mem.Cmp(full) != 0 || sh.cores.Value() != 100 {
		t.Errorf("no request consumed memory %s cores %s, want the whole GPU (%s, 100)", sh.mem.String(), sh.cores.String(), full.String())
	}
	checkLimits(t, v, full.Value()/mib, 100)
	e.deletePods(t, "whole")

	_, sh, v = e.runPod(t, "round", map[string]string{"memory": "8388608001", "cores": "10"})
	if sh.mem.Value() != 8001*mib {
		t.Errorf("8388608001 bytes consumed %s, want 8001Mi", sh.mem.String())
	}
	checkLimits(t, v, 8001, 10)
	e.deletePods(t, "round")

	over := full.DeepCopy()
	over.Add(resource.MustParse("1Mi"))
	e.createPod(t, "too-big", map[string]string{"memory": over.String()})
	msg := e.waitUnschedulable(t, "too-big")
	t.Logf("too-big (%s) pending: %s", over.String(), msg)
	e.deletePods(t, "too-big")
}

// A worker with the CDI spec's edits applied, as a runtime would start
// the container: held to 8000 MiB and to 30 % of the SMs on vgpu-sim, and
// on the node agent's /metrics under the pod's labels.
func (e *draEnv) testWorker(t *testing.T) {
	_, _, v := e.runPod(t, "worker", map[string]string{"memory": "8000Mi", "cores": "30"})
	env := workerEnv(t, v)
	w, held := holdBudget(t, e.s, env, 8000)
	labels := map[string]string{"namespace": "default", "pod": "worker", "container": "main"}
	if err := waitFor(30*time.Second, "the pod's series on the node monitor", func() error {
		text, err := scrape(nil, e.n.agentURL+"/metrics")
		if err != nil {
			return err
		}
		lim, ok := metricValue(text, "hami_vgpu_memory_limit_bytes", labels)
		if !ok || lim != 8000*mib {
			return fmt.Errorf("hami_vgpu_memory_limit_bytes %v %v in\n%s", lim, ok, grepLines(text, "hami_vgpu_"))
		}
		used, ok := metricValue(text, "hami_vgpu_memory_used_bytes", labels)
		if !ok || used < float64(held)*mib {
			return fmt.Errorf("hami_vgpu_memory_used_bytes %v %v", used, ok)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	w.release()
	share := smShare(t, e.s, env, 30)
	if share < 25 || share > 35 {
		t.Errorf("achieved %.1f %% of the device; assigned 30 %%", share)
	}
	e.deletePods(t, "worker")
}

// One cluster, a device-plugin node behind the extender and a DRA node:
// each kind of pod lands on its node and is held to its budget there.
func (e *draEnv) testMixed(t *testing.T) {
	ctx := context.Background()
	if _, err := cp.cs.CoreV1().Pods("default").Create(ctx, gpuPod("mixed-dp", 1024, 20), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.forceDeletePods(t, "default", "mixed-dp") })
	p, a := waitBound(t, e.s, "mixed-dp")
	if p.Spec.NodeName != e.s.gpuNode.name || a.Error != "" || len(a.Containers) != 1 {
		t.Fatalf("mixed-dp on %s, admission %+v", p.Spec.NodeName, a)
	}
	w, _ := holdBudget(t, e.s, workerEnv(t, dmView(a.Containers[0].Options)), 1024)
	w.release()

	_, _, v := e.runPod(t, "mixed-dra", map[string]string{"memory": "1024Mi", "cores": "20"})
	checkLimits(t, v, 1024, 20)
	w, _ = holdBudget(t, e.s, workerEnv(t, v), 1024)
	w.release()
	e.deletePods(t, "mixed-dp", "mixed-dra")
}

// draClient is a raw gRPC client of the driver's DRA service, the
// kubelet's generated types (k8s.io/kubelet/pkg/apis/dra/v1).
func (n *gpuNode) draClient(t *testing.T) drapb.DRAPluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(n.dra.plugin, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	must(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return drapb.NewDRAPluginClient(conn)
}

func cdiIDsOf(r *drapb.NodePrepareResourceResponse) []string {
	var out []string
	for _, d := range r.GetDevices() {
		out = append(out, d.GetCdiDeviceIds()...)
	}
	sort.Strings(out)
	return out
}

// A kubelet restart: the new DRA manager wipes the node's ResourceSlices
// (the real code) and vgpu republishes them within 30 s; a claim prepared
// before it is still what the runtime gets, and a new pod is prepared
// through the re-registered driver. The driver's NodePrepareResources
// twice for one claim answers the same CDI IDs; NodeUnprepareResources of
// a claim it never saw succeeds.
func (e *draEnv) testRestartAndIdempotency(t *testing.T) {
	ctx := context.Background()
	p, sh, _ := e.runPod(t, "before-restart", map[string]string{"memory": "1000Mi", "cores": "10"})

	w, err := cp.cs.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{FieldSelector: fields.Set{
		resourceapi.ResourceSliceSelectorNodeName: e.n.name}.String()})
	must(t, err)
	defer w.Stop()
	t0 := time.Now()
	if _, err := e.n.post("/restart"); err != nil {
		t.Fatal(err)
	}
	var wiped, back time.Duration
	deadline := time.After(60 * time.Second)
	for back == 0 {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("slice watch closed")
			}
			sl, _ := ev.Object.(*resourceapi.ResourceSlice)
			switch {
			case ev.Type == watch.Deleted && wiped == 0:
				wiped = time.Since(t0)
			case wiped != 0 && sl != nil && (ev.Type == watch.Added || ev.Type == watch.Modified) && len(sl.Spec.Devices) == 1:
				back = time.Since(t0)
			}
		case <-deadline:
			t.Fatalf("after the kubelet restart: wiped after %v, not republished within 60 s\n%s\n%s", wiped, e.n.agent.tail(), e.n.dm.tail())
		}
	}
	t.Logf("kubelet restart: slices wiped after %v, republished after %v", wiped, back)
	if back > 30*time.Second {
		t.Errorf("slices republished %v after the kubelet restart, want within 30 s", back)
	}
	// The pod synced by the restarted kubelet: its claim is prepared per
	// the checkpoint, the runtime gets the same CDI device.
	b, err := e.n.post("/pods/" + string(p.UID) + "/resync")
	if err != nil {
		t.Fatalf("%v\n%s", err, e.n.dm.tail())
	}
	var a draAdmission
	must(t, json.Unmarshal(b, &a))
	if !a.Prepared || len(a.Containers) != 1 || !slices.Contains(a.Containers[0].CDIDevices, sh.cdiID) {
		t.Errorf("before-restart synced after the restart: %+v", a)
	}
	_, _, v := e.runPod(t, "after-restart", map[string]string{"memory": "1000Mi", "cores": "10"})
	checkLimits(t, v, 1000, 10)

	c := e.n.draClient(t)
	claim := &drapb.Claim{Namespace: "default", Name: sh.claim.Name, Uid: string(sh.claim.UID)}
	var answers [][]string
	for range 2 {
		r, err := c.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{claim}})
		must(t, err)
		cr := r.GetClaims()[claim.Uid]
		if cr == nil || cr.GetError() != "" {
			t.Fatalf("NodePrepareResources %s: %+v", claim.Uid, r.GetClaims())
		}
		answers = append(answers, cdiIDsOf(cr))
	}
	if !slices.Equal(answers[0], answers[1]) || !slices.Contains(answers[0], sh.cdiID) {
		t.Errorf("prepare twice: %q then %q; want the same, with %s", answers[0], answers[1], sh.cdiID)
	}
	unknown := string(uuid.NewUUID())
	r, err := c.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{
		{Namespace: "default", Name: "never-prepared", Uid: unknown}}})
	must(t, err)
	if cr, ok := r.GetClaims()[unknown]; !ok || cr.GetError() != "" {
		t.Errorf("unprepare of an unknown claim: %+v (want an entry without error)", r.GetClaims())
	}
	e.deletePods(t, "before-restart", "after-restart")
}

// The driver killed right after each prepare step (the agent's test hook
// VGPU_DRA_CRASH_AT) while the kubelet prepares a pod: the kubelet's
// retries reach the agent restarted without the hook, the prepare
// succeeds, and the CDI spec and limits file agree with the allocation;
// the pod's deletion removes both.
func (e *draEnv) testCrash(t *testing.T) {
	for _, step := range []string{"checkpoint-started", "limits-written", "cdi-written"} {
		t.Run(step, func(t *testing.T) {
			n := e.n
			n.agent.stop()
			n.startAgentEnv(t, "VGPU_DRA_CRASH_AT="+step)
			n.waitDRAPlugin(t)
			name := "crash-" + step
			e.createPod(t, name, map[string]string{"memory": "2000Mi", "cores": "10"})
			p := e.waitScheduled(t, name, n.name)
			if err := waitFor(60*time.Second, "vgpu node to abort at "+step, func() error {
				if !n.agent.exited() {
					return fmt.Errorf("still running")
				}
				return nil
			}); err != nil {
				t.Fatalf("%v\n%s", err, n.agent.tail())
			}
			// The kubelet's prepare failed with the driver gone.
			if err := waitFor(10*time.Second, "the kubelet's failed prepare", func() error {
				a, err := n.draAdmission(string(p.UID))
				if err != nil {
					return err
				}
				if a.Prepared {
					return stopWaiting{fmt.Errorf("prepared by a driver that aborted: %+v", a)}
				}
				if a.Attempts < 1 || a.Error == "" {
					return fmt.Errorf("%+v", a)
				}
				return nil
			}); err != nil {
				t.Errorf("%v\n%s", err, n.dm.tail())
			}
			n.startAgentEnv(t)
			n.waitDRAPlugin(t)
			sh := e.shareOf(t, name)
			a := e.waitPrepared(t, p, sh, 90*time.Second)
			t.Logf("prepared after %d attempts", a.Attempts)
			spec := readCDISpec(t, sh.specPath)
			if len(spec.Devices) != 1 {
				t.Errorf("CDI spec of one share has devices %+v", spec.Devices)
			}
			v := cdiView(t, spec, sh.cdiID)
			checkLimits(t, v, 2000, 10)
			limits, _ := toHost(v, "/etc/vgpu/limits")
			region := regionDir(t, v)
			e.deletePods(t, name)
			for _, f := range []string{sh.specPath, limits, region} {
				if _, err := os.Stat(f); !os.IsNotExist(err) {
					t.Errorf("%s after unprepare: %v (want it removed)", f, err)
				}
			}
		})
	}
	// The slices survived the crashes (or came back).
	e.n.waitSlices(t, 1, 30*time.Second)
}

// One container using two shares (one claim, two requests): the
// interposer keeps one budget per device, so the driver refuses it at
// prepare with an error the kubelet records, and keeps refusing.
func (e *draEnv) testTwoShares(t *testing.T) {
	ctx := context.Background()
	one := func() *resourceapi.ExactDeviceRequest {
		return &resourceapi.ExactDeviceRequest{DeviceClassName: draDriver, Capacity: &resourceapi.CapacityRequirements{
			Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("1000Mi"), "cores": resource.MustParse("5")}}}
	}
	name := "two-shares"
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{
			Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "a", Exactly: one()}, {Name: "b", Exactly: one()}}},
		}},
	}
	_, err := cp.cs.ResourceV1().ResourceClaimTemplates("default").Create(ctx, tmpl, metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() {
		_ = cp.cs.ResourceV1().ResourceClaimTemplates("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.PodSpec{
			SchedulerName:  e.schedName,
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &name}},
			Containers: []v1.Container{{Name: "main", Image: "cuda",
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}},
		},
	}
	_, err = cp.cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() { cp.forceDeletePods(t, "default", name) })
	p = e.waitScheduled(t, name, e.n.name)
	c := e.claimOf(t, name)
	if rs := c.Status.Allocation.Devices.Results; len(rs) != 2 || rs[0].Device != rs[1].Device {
		t.Fatalf("allocation %+v: want two shares of one GPU", rs)
	}
	var a *draAdmission
	if err := waitFor(30*time.Second, "the kubelet's prepare refused twice", func() error {
		if a, err = e.n.draAdmission(string(p.UID)); err != nil {
			return err
		}
		if a.Prepared {
			return stopWaiting{fmt.Errorf("prepared: %+v", a)}
		}
		if a.Attempts < 2 || a.Error == "" {
			return fmt.Errorf("%+v", a)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, e.n.agent.tail())
	}
	t.Logf("refused: %s", a.Error)
	if e.n.agent.exited() {
		t.Errorf("vgpu node exited\n%s", e.n.agent.tail())
	}
	e.deletePods(t, name)
}
