package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

func chartDir() string { return repoPath("deploy/helm/vgpu") }

// helm runs the built helm with a private home (no user config leaks in).
func helm(t *testing.T, args ...string) string {
	t.Helper()
	home := t.TempDir()
	cmd := append([]string{"env", "HOME=" + home, "HELM_CACHE_HOME=" + home, "HELM_CONFIG_HOME=" + home,
		"HELM_DATA_HOME=" + home, peer("helm")}, args...)
	out, err := run(cmd[0], cmd[1:]...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// render is `helm template` split into objects.
func render(t *testing.T, release, ns string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out := helm(t, append([]string{"template", release, chartDir(), "--namespace", ns}, args...)...)
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("helm template output: %v\n%s", err, out)
		}
		if len(m) == 0 {
			continue
		}
		if m["kind"] == nil {
			// Not an object: helm printed something else (a warning).
			t.Fatalf("helm template printed a document that is no object: %v\n%s", m, out)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	if len(objs) == 0 {
		t.Fatalf("helm template rendered nothing:\n%s", out)
	}
	return objs
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			return o
		}
	}
	return nil
}

// apply server-side applies objects with strict field validation (an
// unknown or duplicated field is an error, as kubectl apply --server-side
// does), first as a dry run, then for real unless dryOnly.
func apply(t *testing.T, objs []*unstructured.Unstructured, dryOnly bool) {
	t.Helper()
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cp.cs.Discovery()))
	passes := [][]string{{metav1.DryRunAll}}
	if !dryOnly {
		passes = append(passes, nil)
	}
	for _, dry := range passes {
		for _, o := range objs {
			gvk := o.GroupVersionKind()
			m, err := mapper.RESTMapping(schema.GroupKind{Group: gvk.Group, Kind: gvk.Kind}, gvk.Version)
			if err != nil {
				t.Errorf("%s %s: %v", gvk.Kind, o.GetName(), err)
				continue
			}
			body, _ := json.Marshal(o.Object)
			r := cp.dyn.Resource(m.Resource)
			var ri interface {
				Patch(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (*unstructured.Unstructured, error)
				Delete(context.Context, string, metav1.DeleteOptions, ...string) error
			} = r
			if m.Scope.Name() == "namespace" {
				ri = r.Namespace(o.GetNamespace())
			}
			force := true
			_, err = ri.Patch(context.Background(), o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{
				FieldManager: "vgpu-e2e", Force: &force, DryRun: dry, FieldValidation: "Strict",
			})
			if err != nil {
				t.Errorf("apply %s %s/%s (dry run %v): %v", gvk.Kind, o.GetNamespace(), o.GetName(), dry != nil, err)
				continue
			}
			if dry == nil {
				// Tests share the control plane: a webhook or RBAC left
				// behind would act on the next test.
				name := o.GetName()
				t.Cleanup(func() { _ = ri.Delete(context.Background(), name, metav1.DeleteOptions{}) })
			}
		}
	}
}

func TestChartLint(t *testing.T) {
	out := helm(t, "lint", "--strict", chartDir())
	if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
		t.Errorf("helm lint:\n%s", out)
	}
	out = helm(t, "lint", "--strict", chartDir(), "-f", "testdata/hami-values.yaml")
	if !strings.Contains(out, "0 chart(s) failed") {
		t.Errorf("helm lint with HAMi-style values:\n%s", out)
	}
}

// The chart with its defaults is accepted object by object by the real API
// server (validation, defaulting, strict fields), dry run and for real.
func TestChartAppliesWithDefaultValues(t *testing.T) {
	objs := render(t, "vgpu", "kube-system")
	for _, want := range []string{"DaemonSet", "Deployment", "ConfigMap", "MutatingWebhookConfiguration", "Secret", "Service", "ClusterRole"} {
		if find(objs, want, "") == nil {
			t.Errorf("the chart renders no %s", want)
		}
	}
	apply(t, objs, false)
}

// A HAMi user's values (testdata/hami-values.yaml: HAMi's keys and common
// settings) in another namespace and release.
func TestChartAppliesWithHAMiStyleValues(t *testing.T) {
	ensureNamespace(t, "hami-system")
	objs := render(t, "hami", "hami-system", "-f", "testdata/hami-values.yaml")
	ds := find(objs, "DaemonSet", "hami-vgpu-node")
	if ds == nil {
		t.Fatal("no DaemonSet hami-vgpu-node")
	}
	sel, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "spec", "nodeSelector")
	if sel["gpu"] != "on" {
		t.Errorf("nodeSelector %v, want HAMi's gpu=on", sel)
	}
	apply(t, objs, false)
}

// cert-manager instead of the generated certificate: the webhook names the
// Certificate to inject from and carries no caBundle; everything but the
// cert-manager objects (their CRDs are not installed here) is accepted.
func TestChartCertManagerOption(t *testing.T) {
	objs := render(t, "vgpu", "kube-system", "--set", "scheduler.certManager.enabled=true")
	if find(objs, "Certificate", "vgpu-vgpu-scheduler-tls") == nil || find(objs, "Issuer", "") == nil {
		t.Fatal("no cert-manager Certificate and Issuer")
	}
	if find(objs, "Secret", "vgpu-vgpu-scheduler-tls") != nil {
		t.Error("with cert-manager the chart must not also render the TLS Secret")
	}
	mwc := find(objs, "MutatingWebhookConfiguration", "")
	if mwc == nil {
		t.Fatal("no MutatingWebhookConfiguration")
	}
	if got := mwc.GetAnnotations()["cert-manager.io/inject-ca-from"]; got != "kube-system/vgpu-vgpu-scheduler-tls" {
		t.Errorf("inject-ca-from = %q", got)
	}
	hooks, _, _ := unstructured.NestedSlice(mwc.Object, "webhooks")
	if cb, ok, _ := unstructured.NestedString(hooks[0].(map[string]any), "clientConfig", "caBundle"); ok {
		t.Errorf("caBundle %q set with cert-manager", cb)
	}
	var core []*unstructured.Unstructured
	for _, o := range objs {
		if !strings.HasPrefix(o.GetAPIVersion(), "cert-manager.io/") {
			core = append(core, o)
		}
	}
	apply(t, core, true)
}

// `helm install` then `helm upgrade` against the real API server: the
// upgrade keeps the webhook's generated CA and serving pair (a new CA on
// every upgrade would break calls in flight and any copy of the bundle),
// and the MutatingWebhookConfiguration's caBundle is the Secret's CA.
func TestChartUpgradeKeepsTheWebhookCertificate(t *testing.T) {
	const ns, release = "vgpu-upgrade", "up"
	ensureNamespace(t, ns)
	args := []string{release, chartDir(), "--namespace", ns, "--kubeconfig", cp.adminKC,
		"--set", "scheduler.admissionWebhook.failurePolicy=Ignore"}
	helm(t, append([]string{"install"}, args...)...)
	t.Cleanup(func() { helm(t, "uninstall", release, "--namespace", ns, "--kubeconfig", cp.adminKC) })
	ctx := context.Background()
	secretName := release + "-vgpu-scheduler-tls"
	read := func() (crt, ca []byte, bundle []byte) {
		sec, err := cp.cs.CoreV1().Secrets(ns).Get(ctx, secretName, metav1.GetOptions{})
		must(t, err)
		mwc, err := cp.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, release+"-vgpu-scheduler-webhook", metav1.GetOptions{})
		must(t, err)
		if len(mwc.Webhooks) != 1 {
			t.Fatalf("webhooks %d", len(mwc.Webhooks))
		}
		return sec.Data["tls.crt"], sec.Data["ca.crt"], mwc.Webhooks[0].ClientConfig.CABundle
	}
	crt1, ca1, bundle1 := read()
	if len(crt1) == 0 || len(ca1) == 0 || !bytes.Equal(ca1, bundle1) {
		t.Fatalf("after install: tls.crt %d B, ca.crt %d B, caBundle equal to ca.crt: %v", len(crt1), len(ca1), bytes.Equal(ca1, bundle1))
	}
	helm(t, append([]string{"upgrade"}, args...)...)
	crt2, ca2, bundle2 := read()
	if !bytes.Equal(crt1, crt2) || !bytes.Equal(ca1, ca2) {
		t.Error("helm upgrade replaced the webhook's certificate or CA")
	}
	if !bytes.Equal(ca2, bundle2) {
		t.Error("after upgrade the caBundle is not the Secret's CA")
	}
}

// The chart's scheduler configuration is what the real kube-scheduler
// loads (checked by the chain test running it); here: its extender agrees
// with docs/scheduler.md (weight 10, HTTPS, prioritize).
func TestChartSchedulerConfigMatchesDocs(t *testing.T) {
	objs := render(t, "vgpu", "kube-system")
	cm := find(objs, "ConfigMap", "vgpu-vgpu-scheduler")
	if cm == nil {
		t.Fatal("no scheduler ConfigMap")
	}
	cfg, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
	doc, err := os.ReadFile(repoPath("docs/scheduler.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []string{"weight: 10", "enableHTTPS: true", "prioritizeVerb: prioritize", "bindVerb: bind", "nodeCacheCapable: true", "insecure: true"} {
		if !strings.Contains(cfg, kv) {
			t.Errorf("chart's scheduler config lacks %q:\n%s", kv, cfg)
		}
		if !bytes.Contains(doc, []byte(kv)) {
			t.Errorf("docs/scheduler.md lacks %q", kv)
		}
	}
}

// writeFile writes b under dir and returns the path.
func writeFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// HAMi v2.10.0's chart values, every key (testdata/hami-v2.10-values.yaml,
// our values under HAMi's names; docs/helm-values.md has a row for each).
const hamiValues = "testdata/hami-v2.10-values.yaml"

func readHAMiValues(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(hamiValues)
	must(t, err)
	var m map[string]any
	must(t, yaml.Unmarshal(b, &m))
	return m
}

// dig is m[a][b]... (nil when absent).
func dig(m any, path ...string) any {
	for _, p := range path {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil
		}
		m = mm[p]
	}
	return m
}

func nested(t *testing.T, o *unstructured.Unstructured, path ...string) any {
	t.Helper()
	v, ok, err := unstructured.NestedFieldNoCopy(o.Object, path...)
	if err != nil || !ok {
		t.Fatalf("%s %s: no %s", o.GetKind(), o.GetName(), strings.Join(path, "."))
	}
	return v
}

func mustFind(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	o := find(objs, kind, name)
	if o == nil {
		var have []string
		for _, x := range objs {
			have = append(have, x.GetKind()+"/"+x.GetName())
		}
		t.Fatalf("no %s %s in %v", kind, name, have)
	}
	return o
}

func sameJSON(t *testing.T, what string, got, want any) {
	t.Helper()
	g, _ := yaml.Marshal(got)
	w, _ := yaml.Marshal(want)
	if string(g) != string(w) {
		t.Errorf("%s:\n got %s\nwant %s", what, g, w)
	}
}

func secretNames(v any) []string {
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(map[string]any)["name"].(string))
	}
	return out
}

func argsOf(c map[string]any, key string) []string { return stringsOf(c[key]) }

func servicePort(t *testing.T, svc *unstructured.Unstructured, name string) map[string]any {
	t.Helper()
	for _, p := range nested(t, svc, "spec", "ports").([]any) {
		if p.(map[string]any)["name"] == name {
			return p.(map[string]any)
		}
	}
	t.Fatalf("Service %s has no port %s", svc.GetName(), name)
	return nil
}

// A HAMi v2.10 values file with every key set: helm lint --strict and
// helm template take it, the API server takes every object (dry run, then
// for real), and the values vgpu supports reach the objects with HAMi's
// meaning.
func TestChartAppliesWithHAMiV210Values(t *testing.T) {
	out := helm(t, "lint", "--strict", chartDir(), "-f", hamiValues)
	if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
		t.Errorf("helm lint --strict -f %s:\n%s", hamiValues, out)
	}
	v := readHAMiValues(t)
	ns := v["namespaceOverride"].(string)
	ensureNamespace(t, ns)
	ensureNamespace(t, "hami-system")
	objs := render(t, "hami", "hami-system", "-f", hamiValues, "--kube-version", "v1.37.2")
	for _, o := range objs {
		if o.GetKind() != "RuntimeClass" && o.GetKind() != "MutatingWebhookConfiguration" &&
			!strings.HasPrefix(o.GetKind(), "Cluster") && o.GetNamespace() != ns {
			t.Errorf("%s %s in namespace %q, want namespaceOverride %q", o.GetKind(), o.GetName(), o.GetNamespace(), ns)
		}
	}
	dp := v["devicePlugin"].(map[string]any)
	sc := v["scheduler"].(map[string]any)

	// The node agent.
	ds := mustFind(t, objs, "DaemonSet", "hami-vgpu-node")
	pod := nested(t, ds, "spec", "template", "spec").(map[string]any)
	sameJSON(t, "agent tolerations", pod["tolerations"], dp["tolerations"])
	for k, want := range dp["nvidiaNodeSelector"].(map[string]any) {
		if got := dig(pod, "nodeSelector", k); got != want {
			t.Errorf("agent nodeSelector[%s] = %v, want %v", k, got, want)
		}
	}
	if pod["runtimeClassName"] != dp["runtimeClassName"] || pod["hostNetwork"] != dp["hostNetwork"] || pod["hostPID"] != dp["hostPID"] {
		t.Errorf("agent runtimeClassName/hostNetwork/hostPID %v/%v/%v", pod["runtimeClassName"], pod["hostNetwork"], pod["hostPID"])
	}
	if got := secretNames(pod["imagePullSecrets"]); !reflect.DeepEqual(got, []string{"shared-registry", "node-registry"}) {
		t.Errorf("agent imagePullSecrets %v", got)
	}
	sameJSON(t, "agent updateStrategy", nested(t, ds, "spec", "updateStrategy"), dp["updateStrategy"])
	sameJSON(t, "agent pod annotations", nested(t, ds, "spec", "template", "metadata", "annotations"), dp["podAnnotations"])
	if ds.GetLabels()["team"] != "gpu-platform" || ds.GetAnnotations()["owner"] != "gpu-platform" {
		t.Errorf("global labels/annotations missing: %v %v", ds.GetLabels(), ds.GetAnnotations())
	}
	agent := containerOf(t, ds, "vgpu-node")
	sameJSON(t, "agent resources", agent["resources"], dp["resources"])
	sameJSON(t, "agent securityContext", agent["securityContext"], dp["securityContext"])
	if img := agent["image"].(string); !strings.HasPrefix(img, "mirror.example.test/vgpu:") {
		t.Errorf("agent image %s: global.imageRegistry not applied", img)
	}
	args := argsOf(agent, "args")
	for _, want := range []string{
		"--device-list-strategy=" + dp["deviceListStrategy"].(string),
		"--device-plugin-dir=" + dp["pluginPath"].(string),
		"--device-split-count=4", "--device-memory-scaling=1.5", "--enable-numa-topology=true",
		"--core-policy=force", "--lib-cuda-log-level=3", "--legacy-metrics=true", "-v=2",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("agent args lack %s: %v", want, args)
		}
	}
	if !strings.Contains(strings.Join(argsOf(agent, "args"), " "), "-v=2") {
		t.Error("devicePlugin.extraArgs not appended")
	}
	envs, _ := yaml.Marshal(agent["env"])
	if !strings.Contains(string(envs), "EXAMPLE_NODE") {
		t.Errorf("devicePlugin.extraEnvs not in the agent's env:\n%s", envs)
	}
	inits, _ := yaml.Marshal(pod["initContainers"])
	if !strings.Contains(string(inits), "toolkit-validation") || !strings.Contains(string(inits), "/run/nvidia/validations/toolkit-ready") {
		t.Errorf("gpuOperatorToolkitReady: no waiting init container:\n%s", inits)
	}
	rc := mustFind(t, objs, "RuntimeClass", "nvidia")
	if rc.Object["handler"] != "nvidia" {
		t.Errorf("RuntimeClass handler %v", rc.Object["handler"])
	}

	// The scheduler.
	dep := mustFind(t, objs, "Deployment", "hami-vgpu-scheduler")
	if got := nested(t, dep, "spec", "replicas"); fmt.Sprint(got) != fmt.Sprint(sc["replicas"]) {
		t.Errorf("replicas %v with leaderElect, want %v", got, sc["replicas"])
	}
	spod := nested(t, dep, "spec", "template", "spec").(map[string]any)
	sameJSON(t, "scheduler tolerations", spod["tolerations"], sc["tolerations"])
	sameJSON(t, "scheduler nodeSelector", spod["nodeSelector"], sc["nodeSelector"])
	if spod["nodeName"] != sc["nodeName"] {
		t.Errorf("scheduler nodeName %v", spod["nodeName"])
	}
	if got := secretNames(spod["imagePullSecrets"]); !reflect.DeepEqual(got, []string{"shared-registry", "extender-registry", "scheduler-registry"}) {
		t.Errorf("scheduler imagePullSecrets %v", got)
	}
	if dig(spod, "affinity", "podAntiAffinity") == nil {
		t.Error("leaderElect: no pod anti-affinity")
	}
	ks := containerOf(t, dep, "kube-scheduler")
	if ks["image"] != "mirror.example.test/kube-scheduler:v1.37.2" || ks["imagePullPolicy"] != "Always" {
		t.Errorf("kube-scheduler image %v %v", ks["image"], ks["imagePullPolicy"])
	}
	sameJSON(t, "kube-scheduler resources", ks["resources"], dig(sc, "kubeScheduler", "resources"))
	if cmd := argsOf(ks, "command"); !slices.Contains(cmd, "-v=2") || cmd[1] != "--config=/config/config.yaml" {
		t.Errorf("kube-scheduler command %v", cmd)
	}
	if ks["livenessProbe"] == nil {
		t.Error("livenessProbe: true, but kube-scheduler has none")
	}
	ext := containerOf(t, dep, "vgpu-scheduler")
	sameJSON(t, "extender resources", ext["resources"], dig(sc, "extender", "resources"))
	eargs := argsOf(ext, "args")
	for _, want := range []string{
		"--metrics-bind-address=" + sc["metricsBindAddress"].(string),
		"--node-label-selector=gpu=on", "--node-label-selector=pool=shared",
		"--force-overwrite-default-scheduler=false", "--node-scheduler-policy=spread",
		"--gpu-scheduler-policy=binpack", "--node-lock-expire=3m", "--legacy-metrics=true",
		"--device-config-file=/device-config.yaml", "--debug", "-v=2",
	} {
		if !slices.Contains(eargs, want) {
			t.Errorf("scheduler args lack %s: %v", want, eargs)
		}
	}
	ports, _ := yaml.Marshal(ext["ports"])
	if !strings.Contains(string(ports), "containerPort: 9396") {
		t.Errorf("scheduler metrics port is not monitorTargetPort 9396:\n%s", ports)
	}
	cm := mustFind(t, objs, "ConfigMap", "hami-vgpu-scheduler")
	var cfg map[string]any
	must(t, yaml.Unmarshal([]byte(nested(t, cm, "data", "config.yaml").(string)), &cfg))
	sameJSON(t, "kube-scheduler leaderElection", cfg["leaderElection"],
		map[string]any{"leaderElect": true, "resourceName": "hami-scheduler", "resourceNamespace": ns})
	dcm := mustFind(t, objs, "ConfigMap", "hami-vgpu-scheduler-device")
	if got := nested(t, dcm, "data", "device-config.yaml"); strings.TrimSpace(got.(string)) != strings.TrimSpace(v["device-config"].(map[string]any)["content"].(string)) {
		t.Errorf("device-config.content not the scheduler's device config:\n%s", got)
	}

	// HAMi's Services, under HAMi's names for release "hami".
	svc := mustFind(t, objs, "Service", "hami-scheduler")
	ssvc := sc["service"].(map[string]any)
	if nested(t, svc, "spec", "type") != "NodePort" {
		t.Errorf("scheduler Service type %v", nested(t, svc, "spec", "type"))
	}
	sameJSON(t, "scheduler Service http port", servicePort(t, svc, "http"),
		map[string]any{"name": "http", "port": ssvc["httpPort"], "targetPort": ssvc["httpTargetPort"], "nodePort": ssvc["schedulerPort"], "protocol": "TCP"})
	sameJSON(t, "scheduler Service monitor port", servicePort(t, svc, "monitor"),
		map[string]any{"name": "monitor", "port": ssvc["monitorPort"], "targetPort": ssvc["monitorTargetPort"], "nodePort": ssvc["monitorPort"], "protocol": "TCP"})
	if svc.GetLabels()["example.test/scrape"] != "hami" || svc.GetAnnotations()["example.test/note"] != "scheduler" {
		t.Errorf("scheduler.service labels/annotations: %v %v", svc.GetLabels(), svc.GetAnnotations())
	}
	dsvc := mustFind(t, objs, "Service", "hami-device-plugin-monitor")
	sameJSON(t, "device-plugin Service port", servicePort(t, dsvc, "monitorport"),
		map[string]any{"name": "monitorport", "port": dig(dp, "service", "httpPort"), "targetPort": 9394, "nodePort": dig(dp, "service", "httpPort"), "protocol": "TCP"})

	// The webhook: through HAMi's scheduler Service, HAMi's selectors and policies.
	mwc := mustFind(t, objs, "MutatingWebhookConfiguration", "")
	hook := nested(t, mwc, "webhooks").([]any)[0].(map[string]any)
	sameJSON(t, "webhook service", dig(hook, "clientConfig", "service"),
		map[string]any{"name": "hami-scheduler", "namespace": ns, "path": "/webhook", "port": ssvc["httpPort"]})
	wh := sc["admissionWebhook"].(map[string]any)
	if hook["failurePolicy"] != wh["failurePolicy"] || hook["reinvocationPolicy"] != wh["reinvocationPolicy"] {
		t.Errorf("webhook policies %v %v", hook["failurePolicy"], hook["reinvocationPolicy"])
	}
	sameJSON(t, "webhook namespaceSelector", hook["namespaceSelector"], map[string]any{
		"matchLabels": dig(wh, "namespaceSelector", "matchLabels"),
		"matchExpressions": []any{
			map[string]any{"key": "hami.io/webhook", "operator": "NotIn", "values": []any{"ignore"}},
			map[string]any{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": wh["whitelistNamespaces"]},
			dig(wh, "namespaceSelector", "matchExpressions").([]any)[0],
		},
	})
	sameJSON(t, "webhook objectSelector", hook["objectSelector"], map[string]any{
		"matchLabels": dig(wh, "objectSelector", "matchLabels"),
		"matchExpressions": []any{
			map[string]any{"key": "hami.io/webhook", "operator": "NotIn", "values": []any{"ignore"}},
			dig(wh, "objectSelector", "matchExpressions").([]any)[0],
		},
	})
	// The certificate the API server checks names the Service it calls.
	sec := mustFind(t, objs, "Secret", "hami-vgpu-scheduler-tls")
	crt := servingCert(t, sec)
	if err := crt.VerifyHostname("hami-scheduler." + ns + ".svc"); err != nil {
		t.Errorf("serving certificate: %v", err)
	}

	apply(t, objs, false)
}

func servingCert(t *testing.T, sec *unstructured.Unstructured) *x509.Certificate {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(nested(t, sec, "data", "tls.crt").(string))
	must(t, err)
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("tls.crt is not PEM")
	}
	crt, err := x509.ParseCertificate(blk.Bytes)
	must(t, err)
	return crt
}

// HAMi's ServiceMonitors select Services by app.kubernetes.io/component
// (hami-scheduler, hami-device-plugin), app.kubernetes.io/name (hami) and
// app.kubernetes.io/instance (the release), and scrape the ports named
// monitor and monitorport: the chart's HAMi-compatible Services carry
// exactly that for the same release name, with HAMi's node ports, and the
// ServiceMonitors the chart renders (prometheus.enabled) find them.
func TestChartServicesMatchHAMiServiceMonitors(t *testing.T) {
	for _, tc := range []struct {
		release, sched, plugin string
		args                   []string
	}{
		{"vgpu", "vgpu-hami-scheduler", "vgpu-hami-device-plugin-monitor", nil},
		{"hami", "hami-scheduler", "hami-device-plugin-monitor", nil},
		{"gpu", "gpu-share-scheduler", "gpu-share-device-plugin-monitor", []string{"--set", "fullnameOverride=gpu-share"}},
	} {
		args := append([]string{"--set", "prometheus.enabled=true", "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"}, tc.args...)
		objs := render(t, tc.release, "kube-system", args...)
		for _, m := range []struct{ svc, component, port string }{
			{tc.sched, "hami-scheduler", "monitor"},
			{tc.plugin, "hami-device-plugin", "monitorport"},
		} {
			svc := mustFind(t, objs, "Service", m.svc)
			hamiSelector := map[string]string{
				"app.kubernetes.io/component": m.component,
				"app.kubernetes.io/name":      "hami",
				"app.kubernetes.io/instance":  tc.release,
			}
			for k, want := range hamiSelector {
				if got := svc.GetLabels()[k]; got != want {
					t.Errorf("%s: label %s = %q, want %q (HAMi's ServiceMonitor selector)", m.svc, k, got, want)
				}
			}
			servicePort(t, svc, m.port)
			// The chart's own ServiceMonitor selects it too.
			found := false
			for _, o := range objs {
				if o.GetKind() != "ServiceMonitor" {
					continue
				}
				sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
				eps, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
				if reflect.DeepEqual(sel, hamiSelector) && len(eps) == 1 && eps[0].(map[string]any)["port"] == m.port {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: no ServiceMonitor selects it on port %s", m.svc, m.port)
			}
			// The Service reaches vgpu's pods.
			sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
			var podLabels map[string]string
			if m.component == "hami-scheduler" {
				podLabels, _, _ = unstructured.NestedStringMap(mustFind(t, objs, "Deployment", tc.release+"-vgpu-scheduler").Object, "spec", "template", "metadata", "labels")
			} else {
				podLabels, _, _ = unstructured.NestedStringMap(mustFind(t, objs, "DaemonSet", tc.release+"-vgpu-node").Object, "spec", "template", "metadata", "labels")
			}
			for k, want := range sel {
				if podLabels[k] != want {
					t.Errorf("%s selects %s=%s, the pods have %v", m.svc, k, want, podLabels)
				}
			}
		}
		// HAMi's default node ports.
		if tc.release == "vgpu" {
			for svc, ports := range map[string]map[string]int64{
				tc.sched:  {"http": 31998, "monitor": 31993},
				tc.plugin: {"monitorport": 31992},
			} {
				s := mustFind(t, objs, "Service", svc)
				for name, want := range ports {
					if got := servicePort(t, s, name)["nodePort"]; fmt.Sprint(got) != fmt.Sprint(want) {
						t.Errorf("%s %s nodePort %v, want HAMi's %d", svc, name, got, want)
					}
				}
			}
		}
		// vgpu's own Services are still there.
		for _, name := range []string{tc.release + "-vgpu-node-monitor", tc.release + "-vgpu-scheduler-metrics", tc.release + "-vgpu-scheduler"} {
			mustFind(t, objs, "Service", name)
		}
	}
}

// The webhook and Service options HAMi's values have beyond the test file's
// choices: a custom URL (in the certificate too), no webhook, no managed
// namespaceSelector, ClusterIP Services (no node ports), no leader
// election (one replica), no kube-scheduler, no agent.
func TestChartHAMiOptionalShapes(t *testing.T) {
	objs := render(t, "vgpu", "kube-system",
		"--set", "scheduler.admissionWebhook.customURL.enabled=true",
		"--set", "scheduler.admissionWebhook.customURL.host=webhook.example.test",
		"--set", "scheduler.admissionWebhook.customURL.port=32443",
		"--set", "scheduler.admissionWebhook.manageNamespaceSelector=false",
		"--set", "scheduler.service.type=ClusterIP",
		"--set", "devicePlugin.service.type=ClusterIP",
		"--set", "scheduler.leaderElect=false",
		"--set", "scheduler.replicas=3")
	mwc := mustFind(t, objs, "MutatingWebhookConfiguration", "")
	hook := nested(t, mwc, "webhooks").([]any)[0].(map[string]any)
	if got := dig(hook, "clientConfig", "url"); got != "https://webhook.example.test:32443/webhook" {
		t.Errorf("customURL: clientConfig.url %v", got)
	}
	if dig(hook, "clientConfig", "service") != nil || hook["namespaceSelector"] != nil {
		t.Errorf("customURL / manageNamespaceSelector=false: %v", hook)
	}
	if err := servingCert(t, mustFind(t, objs, "Secret", "vgpu-vgpu-scheduler-tls")).VerifyHostname("webhook.example.test"); err != nil {
		t.Errorf("customURL host not in the certificate: %v", err)
	}
	for _, name := range []string{"vgpu-hami-scheduler", "vgpu-hami-device-plugin-monitor"} {
		s := mustFind(t, objs, "Service", name)
		if nested(t, s, "spec", "type") != "ClusterIP" {
			t.Errorf("%s type %v", name, nested(t, s, "spec", "type"))
		}
		for _, p := range nested(t, s, "spec", "ports").([]any) {
			if _, ok := p.(map[string]any)["nodePort"]; ok {
				t.Errorf("%s: a nodePort with ClusterIP", name)
			}
		}
	}
	if got := nested(t, mustFind(t, objs, "Deployment", "vgpu-vgpu-scheduler"), "spec", "replicas"); fmt.Sprint(got) != "1" {
		t.Errorf("leaderElect=false: replicas %v, want 1 (HAMi's chart)", got)
	}
	apply(t, objs, true)

	objs = render(t, "vgpu", "kube-system",
		"--set", "scheduler.admissionWebhook.enabled=false",
		"--set", "scheduler.kubeScheduler.enabled=false",
		"--set", "devicePlugin.enabled=false")
	for _, kind := range []string{"MutatingWebhookConfiguration", "DaemonSet"} {
		if find(objs, kind, "") != nil {
			t.Errorf("%s rendered though disabled", kind)
		}
	}
	if find(objs, "ConfigMap", "vgpu-vgpu-scheduler") != nil {
		t.Error("kubeScheduler.enabled=false: its ConfigMap rendered")
	}
	for _, c := range nested(t, mustFind(t, objs, "Deployment", "vgpu-vgpu-scheduler"), "spec", "template", "spec", "containers").([]any) {
		if c.(map[string]any)["name"] == "kube-scheduler" {
			t.Error("kubeScheduler.enabled=false: kube-scheduler container rendered")
		}
	}
	apply(t, objs, true)
}

// docs/helm-values.md has a row for every key of the HAMi values file, and
// the file has every key the table lists: neither can drift from the other.
func TestHelmValuesTableCoversTheHAMiValuesFile(t *testing.T) {
	f, err := os.Open(repoPath("docs/helm-values.md"))
	must(t, err)
	defer f.Close()
	rows := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cells := strings.Split(sc.Text(), "|")
		if len(cells) < 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		key := strings.Trim(strings.TrimSpace(cells[1]), "`")
		status := strings.TrimSpace(cells[2])
		switch status {
		case "supported", "renamed", "not applicable":
		default:
			t.Errorf("row %s: status %q", key, status)
		}
		if _, dup := rows[key]; dup {
			t.Errorf("row %s twice", key)
		}
		rows[key] = status
	}
	must(t, sc.Err())
	if len(rows) < 150 {
		t.Fatalf("only %d rows in docs/helm-values.md", len(rows))
	}
	// Every key path of the file (a list is a leaf), and its nearest row.
	var paths [][]string
	var walk func(prefix []string, v any)
	walk = func(prefix []string, v any) {
		m, ok := v.(map[string]any)
		if !ok || len(m) == 0 {
			paths = append(paths, prefix)
			return
		}
		for k, x := range m {
			walk(append(slices.Clone(prefix), k), x)
		}
	}
	walk(nil, readHAMiValues(t))
	used := map[string]bool{}
	var missing []string
	for _, p := range paths {
		found := false
		for i := len(p); i > 0; i-- {
			if _, ok := rows[strings.Join(p[:i], ".")]; ok {
				used[strings.Join(p[:i], ".")] = true
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, strings.Join(p, "."))
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("%s (in %s) has no row in docs/helm-values.md", m, hamiValues)
	}
	var unused []string
	for k := range rows {
		if !used[k] {
			unused = append(unused, k)
		}
	}
	sort.Strings(unused)
	for _, k := range unused {
		t.Errorf("docs/helm-values.md row %s: %s does not set it", k, hamiValues)
	}
}
