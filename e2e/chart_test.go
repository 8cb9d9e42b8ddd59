package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
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
