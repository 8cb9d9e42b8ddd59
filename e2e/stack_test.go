package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"sigs.k8s.io/yaml"
)

const (
	release   = "vgpu"
	releaseNS = "kube-system"
	nodeName  = "gpu-node-1"
	nodeSA    = "vgpu-vgpu-node"
	schedSA   = "vgpu-vgpu-scheduler"
)

// stack is vgpu deployed as the chart says, on the shared control plane:
// the chart applied (ServiceAccounts, RBAC, ConfigMap, TLS Secret, webhook),
// `vgpu scheduler` with the chart's arguments and TLS, the real
// kube-scheduler with the chart's configuration, both as the chart's
// ServiceAccount; one node: the kubelet's device manager (cmd/devicemanager)
// in a private mount namespace and `vgpu node` with the DaemonSet's
// arguments as its ServiceAccount on a simulated GPU machine. More nodes
// (addNode) share that machine, each with its own device manager, mount
// namespace and agent.
type stack struct {
	*gpuNode  // the first node
	t         *testing.T
	dir       string
	objs      []*unstructured.Unstructured
	schedURL  string // https://127.0.0.1:port
	schedTLS  *http.Client
	metrics   string // the scheduler's metrics URL
	sched, ks *proc
	simDir    string
	simEnv    []string
	more      []*gpuNode
	draArgs   []string // the DaemonSet's vgpu-node args with DRA on (enableDRA)
}

// gpuNode is one kubelet (its device manager, or for a DRA node its
// plugin and DRA managers: cmd/drakubelet) and its `vgpu node`.
type gpuNode struct {
	s         *stack
	name      string
	agentURL  string // the node agent's monitor URL
	dmURL     string // the kubelet stand-in's HTTP URL
	dm, agent *proc
	agentArgs []string
	dra       *draDirs // nil: a device-plugin node
	agentRuns int
}

// withFlags replaces the values of --flag=... entries (clap refuses a flag
// given twice) and appends the flags args lacks.
func withFlags(args []string, set map[string]string) []string {
	out := []string{}
	done := map[string]bool{}
	for _, a := range args {
		k, _, _ := strings.Cut(a, "=")
		if v, ok := set[k]; ok {
			out = append(out, k+"="+v)
			done[k] = true
			continue
		}
		out = append(out, a)
	}
	for k, v := range set {
		if !done[k] {
			out = append(out, k+"="+v)
		}
	}
	return out
}

func containerOf(t *testing.T, o *unstructured.Unstructured, name string) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	for _, c := range cs {
		if c.(map[string]any)["name"] == name {
			return c.(map[string]any)
		}
	}
	t.Fatalf("%s has no container %s", o.GetName(), name)
	return nil
}

func stringsOf(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

func startStack(t *testing.T, devices int, extraAgentArgs ...string) *stack {
	t.Helper()
	s := &stack{t: t, dir: t.TempDir()}
	t.Cleanup(s.stop)
	port := freePort()
	s.objs = render(t, release, releaseNS,
		"--set", fmt.Sprintf("scheduler.service.httpTargetPort=%d", port),
		// Fail, not the chart's Ignore: a webhook the API server cannot
		// use must fail pod creation here, not pass silently.
		"--set", "scheduler.admissionWebhook.failurePolicy=Fail")
	var core []*unstructured.Unstructured
	var mwc *unstructured.Unstructured
	for _, o := range s.objs {
		if o.GetKind() == "MutatingWebhookConfiguration" {
			mwc = o.DeepCopy()
			continue
		}
		core = append(core, o)
	}
	apply(t, core, false)
	if t.Failed() {
		t.FailNow()
	}
	// Cleanups run last-first: the processes stop before the objects they
	// need (RBAC) are deleted, so teardown logs no refusals.
	t.Cleanup(s.stopProcs)

	// TLS: the Secret the chart generated, as the pod would mount it.
	sec := find(s.objs, "Secret", "vgpu-vgpu-scheduler-tls")
	data, _, _ := unstructured.NestedStringMap(sec.Object, "data")
	tlsDir := filepath.Join(s.dir, "tls")
	must(t, os.MkdirAll(tlsDir, 0o700))
	var caPEM []byte
	for k, v := range data {
		b, err := base64.StdEncoding.DecodeString(v)
		must(t, err)
		writeFile(t, tlsDir, k, b)
		if k == "ca.crt" {
			caPEM = b
		}
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	s.schedTLS = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}

	// The device config the pod mounts at /device-config.yaml.
	dcm := find(s.objs, "ConfigMap", "vgpu-vgpu-scheduler-device")
	dcfg, _, _ := unstructured.NestedString(dcm.Object, "data", "device-config.yaml")
	devCfgPath := writeFile(t, s.dir, "device-config.yaml", []byte(dcfg))

	// vgpu scheduler, the Deployment's container arguments.
	dep := find(s.objs, "Deployment", "vgpu-vgpu-scheduler")
	vs := containerOf(t, dep, "vgpu-scheduler")
	mport := freePort()
	args := withFlags(stringsOf(vs["args"]), map[string]string{
		"--device-config-file": devCfgPath,
		// Loopback only here; the chart binds all addresses (the API
		// server reaches the webhook through the Service).
		"--http_bind":            fmt.Sprintf("127.0.0.1:%d", port),
		"--cert_file":            filepath.Join(tlsDir, "tls.crt"),
		"--key_file":             filepath.Join(tlsDir, "tls.key"),
		"--metrics-bind-address": fmt.Sprintf("127.0.0.1:%d", mport),
	})
	var err error
	s.sched, err = startProc(s.dir, "vgpu-scheduler", append([]string{cargoBin("vgpu")}, args...),
		[]string{"KUBECONFIG=" + cp.saKubeconfig(t, releaseNS, schedSA)})
	must(t, err)
	s.schedURL = fmt.Sprintf("https://127.0.0.1:%d", port)
	s.metrics = fmt.Sprintf("http://127.0.0.1:%d/metrics", mport)
	if err := waitFor(60*time.Second, "vgpu scheduler /healthz over HTTPS", func() error {
		if s.sched.exited() {
			return stopWaiting{fmt.Errorf("exited\n%s", s.sched.tail())}
		}
		r, err := s.schedTLS.Get(s.schedURL + "/healthz")
		if err != nil {
			return err
		}
		r.Body.Close()
		if r.StatusCode != 200 {
			return fmt.Errorf("HTTP %d", r.StatusCode)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, s.sched.tail())
	}

	// The chart's webhook, pointed at that address: the API server reaches a
	// Service only through cluster networking (ClusterIP or endpoint
	// routing; endpoints may not be loopback), so clientConfig.service
	// becomes the same server's URL. caBundle, rules, selectors, policies
	// are the chart's.
	hooks, _, _ := unstructured.NestedSlice(mwc.Object, "webhooks")
	h := hooks[0].(map[string]any)
	cc := h["clientConfig"].(map[string]any)
	path := cc["service"].(map[string]any)["path"].(string)
	delete(cc, "service")
	cc["url"] = s.schedURL + path
	must(t, unstructured.SetNestedSlice(mwc.Object, hooks, "webhooks"))
	apply(t, []*unstructured.Unstructured{mwc}, false)

	// The real kube-scheduler with the chart's configuration and arguments.
	cm := find(s.objs, "ConfigMap", "vgpu-vgpu-scheduler")
	text, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
	var cfg map[string]any
	must(t, yaml.Unmarshal([]byte(text), &cfg))
	cfg["clientConnection"] = map[string]any{"kubeconfig": cp.saKubeconfig(t, releaseNS, schedSA)}
	b, _ := yaml.Marshal(cfg)
	cfgPath := writeFile(t, s.dir, "kube-scheduler.yaml", b)
	kc := containerOf(t, dep, "kube-scheduler")
	kargs := withFlags(stringsOf(kc["command"])[1:], map[string]string{
		"--config": cfgPath,
		// No serving port: nothing here scrapes it, and it would bind
		// every address.
		"--secure-port": "0",
	})
	s.ks, err = startProc(s.dir, "kube-scheduler", append([]string{peer("kube-scheduler")}, kargs...), nil)
	must(t, err)

	// The simulated GPU machine.
	s.simDir = filepath.Join(s.dir, "sim")
	out, err := run(cargoBin("vgpu"), "sim", "env", "--dir", s.simDir, "--devices", fmt.Sprint(devices))
	if err != nil {
		t.Fatalf("vgpu sim env: %v\n%s", err, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if kv, ok := strings.CutPrefix(strings.TrimSpace(l), "export "); ok {
			// K='value' or K='value'${K:+:$K}: the quoted part (the
			// processes started here get no inherited value to append).
			k, v, _ := strings.Cut(kv, "=")
			if q, ok := strings.CutPrefix(v, "'"); ok {
				v, _, _ = strings.Cut(q, "'")
			}
			s.simEnv = append(s.simEnv, k+"="+v)
		}
	}
	if len(s.simEnv) == 0 {
		t.Fatalf("vgpu sim env printed no exports:\n%s", out)
	}

	s.gpuNode = s.startNode(nodeName, devices, extraAgentArgs...)
	return s
}

// addNode starts another node on the same simulated machine (its GPUs
// are the first node's, as far as the scheduler can tell: the ledger is
// per node).
func (s *stack) addNode(name string, devices int, extraAgentArgs ...string) *gpuNode {
	n := s.startNode(name, devices, extraAgentArgs...)
	s.more = append(s.more, n)
	return n
}

func (s *stack) startNode(name string, devices int, extraAgentArgs ...string) *gpuNode {
	t := s.t
	n := &gpuNode{s: s, name: name}
	dir := filepath.Join(s.dir, name)
	must(t, os.MkdirAll(dir, 0o755))
	// The kubelet's device manager: its socket directory is fixed, so a
	// private mount namespace with a tmpfs there.
	must(t, os.MkdirAll(devicemanagerDir, 0o755))
	var err error
	n.dm, err = startProc(dir, "devicemanager", []string{"unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs tmpfs "$0" && exec "$@"`, devicemanagerDir,
		peer("devicemanager"), "--kubeconfig=" + cp.adminKC, "--node-name=" + name, "--node-labels=gpu=on"}, nil)
	must(t, err)
	u, err := n.dm.waitLine("devicemanager: listening on ", 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	n.dmURL = u

	// vgpu node with the DaemonSet's arguments, in the device manager's
	// mount namespace (it sees the same device-plugins directory).
	ds := find(s.objs, "DaemonSet", "vgpu-vgpu-node")
	nc := containerOf(t, ds, "vgpu-node")
	hook := filepath.Join(dir, "hook")
	run_ := filepath.Join(dir, "run-vgpu")
	for _, d := range []string{hook, run_} {
		must(t, os.MkdirAll(d, 0o755))
	}
	must(t, os.Chmod(s.dir, 0o755))
	must(t, os.Chmod(dir, 0o755))
	set := map[string]string{
		"--hook-path":     hook,
		"--lib-path":      cargoBin("libvgpu.so"),
		"--broker-socket": filepath.Join(run_, "hostpid.sock"),
		"--metrics-addr":  "127.0.0.1:0",
		"--node-name":     name,
		"--kubeconfig":    cp.saKubeconfig(t, releaseNS, nodeSA),
		"--nvml-library":  filepath.Join(s.simDir, "lib/libnvidia-ml.so.1"),
		"--lock-dir":      filepath.Join(dir, "vgpulock"),
	}
	for i := 0; i+1 < len(extraAgentArgs); i += 2 {
		set[extraAgentArgs[i]] = extraAgentArgs[i+1]
	}
	n.agentArgs = withFlags(stringsOf(nc["args"]), set)
	n.startAgent()
	// The device manager registered the plugin and published capacity.
	n.waitAllocatable(devices * 10)
	return n
}

const devicemanagerDir = "/var/lib/kubelet/device-plugins"

func (n *gpuNode) startAgent() {
	n.startAgentEnv(n.s.t)
}

// startAgentEnv starts `vgpu node` with extra env (a test hook); a DRA
// node's agent needs no mount namespace (every directory is a flag).
func (n *gpuNode) startAgentEnv(t *testing.T, env ...string) {
	t.Helper()
	argv := append([]string{"nsenter", fmt.Sprintf("--mount=/proc/%d/ns/mnt", n.dmPid()), "--", cargoBin("vgpu")}, n.agentArgs...)
	if n.dra != nil {
		argv = append([]string{cargoBin("vgpu")}, n.agentArgs...)
	}
	var err error
	env = append(append([]string{"LD_PRELOAD=", "KUBECONFIG="}, n.s.simEnv...), env...)
	// A restarted agent logs to a new file: the last run's log is evidence.
	name := "vgpu-node"
	if n.agentRuns++; n.agentRuns > 1 {
		name = fmt.Sprintf("vgpu-node.%d", n.agentRuns)
	}
	n.agent, err = startProc(filepath.Join(n.s.dir, n.name), name, argv, env)
	must(t, err)
	u, err := n.agent.waitLine("vgpu node: monitor on ", 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	n.agentURL = u
}

// dmPid is the device manager's pid (unshare's sh exec'd into it).
func (n *gpuNode) dmPid() int {
	pid := n.dm.cmd.Process.Pid
	// unshare forks nothing without --fork: same pid all the way.
	return pid
}

func (n *gpuNode) waitAllocatable(count int) {
	t := n.s.t
	if err := waitFor(60*time.Second, fmt.Sprintf("node %s allocatable nvidia.com/gpu=%d", n.name, count), func() error {
		if n.agent.exited() {
			return stopWaiting{fmt.Errorf("vgpu node exited\n%s", n.agent.tail())}
		}
		node, err := cp.cs.CoreV1().Nodes().Get(context.Background(), n.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		q := node.Status.Allocatable["nvidia.com/gpu"]
		if q.Value() != int64(count) {
			return fmt.Errorf("allocatable %v", node.Status.Allocatable)
		}
		if node.Annotations["hami.io/node-nvidia-register"] == "" {
			return fmt.Errorf("no register annotation yet")
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s\n%s", err, n.agent.tail(), n.dm.tail())
	}
}

// procs is every process of the stack, node processes first.
func (s *stack) procs() []*proc {
	var ps []*proc
	for _, n := range append([]*gpuNode{s.gpuNode}, s.more...) {
		if n != nil {
			ps = append(ps, n.agent, n.dm)
		}
	}
	return append(ps, s.ks, s.sched)
}

func (s *stack) stopProcs() {
	for _, p := range s.procs() {
		p.stop()
	}
}

func (s *stack) stop() {
	s.stopProcs()
	if s.simDir != "" {
		_, _ = run("env", "VGPU_SIM_DIR="+s.simDir, cargoBin("vgpu"), "sim", "stop")
	}
	ctx := context.Background()
	_ = cp.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, "vgpu-vgpu-scheduler-webhook", metav1.DeleteOptions{})
	zero := int64(0)
	_ = cp.cs.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	if s.gpuNode != nil {
		_ = cp.cs.CoreV1().Nodes().Delete(ctx, s.gpuNode.name, metav1.DeleteOptions{})
	}
	for _, n := range s.more {
		_ = cp.cs.CoreV1().Nodes().Delete(ctx, n.name, metav1.DeleteOptions{})
	}
	// Every process ran as the chart's ServiceAccount: a call its RBAC
	// refuses fails the test even where the process only logged it.
	for _, p := range s.procs() {
		if p == nil || strings.HasPrefix(p.name, "devicemanager") || strings.HasPrefix(p.name, "drakubelet") {
			continue
		}
		for _, l := range strings.Split(p.output(), "\n") {
			if strings.Contains(strings.ToLower(l), "forbidden") {
				s.t.Errorf("%s was refused by RBAC: %s", p.name, l)
			}
		}
	}
	if s.t.Failed() {
		for _, p := range s.procs() {
			if p != nil {
				s.t.Log(p.tail())
			}
		}
	}
}

// admission is the device manager's outcome for a pod.
type admission struct {
	Error      string `json:"error"`
	Containers []struct {
		Name    string                                   `json:"name"`
		Options *devicemanager.DeviceRunContainerOptions `json:"options"`
	} `json:"containers"`
}

func (n *gpuNode) admission(uid string) (*admission, error) {
	r, err := http.Get(n.dmURL + "/pods/" + uid)
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	if r.StatusCode != 200 {
		return nil, fmt.Errorf("HTTP %d: %s", r.StatusCode, b)
	}
	var a admission
	return &a, json.Unmarshal(b, &a)
}

func (n *gpuNode) waitAdmission(uid string, timeout time.Duration) *admission {
	var a *admission
	if err := waitFor(timeout, "device manager admission of "+uid, func() error {
		var err error
		a, err = n.admission(uid)
		return err
	}); err != nil {
		n.s.t.Fatalf("%v\n%s", err, n.agent.tail())
	}
	return a
}

func (n *gpuNode) post(path string) ([]byte, error) {
	r, err := http.Post(n.dmURL+path, "application/json", nil)
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	if r.StatusCode != 200 {
		return b, fmt.Errorf("POST %s: HTTP %d: %s", path, r.StatusCode, b)
	}
	return b, nil
}

func scrape(client *http.Client, url string) (string, error) {
	if client == nil {
		client = http.DefaultClient
	}
	r, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	return string(b), err
}

// gpuPod is a pod as a user writes it (no nvidia.com/gpu: the webhook adds it).
func gpuPod(name string, memMiB, cores int) *v1.Pod {
	lim := v1.ResourceList{
		"nvidia.com/gpumem":   resourceQ(memMiB),
		"nvidia.com/gpucores": resourceQ(cores),
		"nvidia.com/priority": resourceQ(1),
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.PodSpec{
			Containers: []v1.Container{{Name: "main", Image: "cuda", Resources: v1.ResourceRequirements{Limits: lim}}},
		},
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
