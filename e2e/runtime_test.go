package e2e

import (
	"encoding/json"
	"io"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// What a container runtime makes of the kubelet's answer, on this host:
// the container's env and its mounts (container path → host path). Both
// the device manager's DeviceRunContainerOptions and a CDI device's
// containerEdits come down to this; workerEnv turns it into a worker's
// env here.

type mountView struct {
	containerPath, hostPath string
	readOnly                bool
}

type containerView struct {
	env    map[string]string
	mounts []mountView
}

// dmView is the device manager's answer as the runtime applies it.
func dmView(o *devicemanager.DeviceRunContainerOptions) containerView {
	v := containerView{env: envOf(o)}
	for _, m := range o.Mounts {
		v.mounts = append(v.mounts, mountView{m.ContainerPath, m.HostPath, m.ReadOnly})
	}
	return v
}

// cdiSpec is a CDI spec file (cncf-tags/container-device-interface SPEC.md,
// the fields a runtime applies here). Unknown fields are refused, as CDI
// loaders refuse them.
type cdiSpec struct {
	Version        string      `json:"cdiVersion"`
	Kind           string      `json:"kind"`
	Annotations    any         `json:"annotations,omitempty"`
	Devices        []cdiDevice `json:"devices"`
	ContainerEdits *cdiEdits   `json:"containerEdits,omitempty"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	Annotations    any      `json:"annotations,omitempty"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env            []string   `json:"env,omitempty"`
	DeviceNodes    []any      `json:"deviceNodes,omitempty"`
	Mounts         []cdiMount `json:"mounts,omitempty"`
	Hooks          []any      `json:"hooks,omitempty"`
	AdditionalGIDs []int      `json:"additionalGids,omitempty"`
	IntelRdt       any        `json:"intelRdt,omitempty"`
	NetDevices     []any      `json:"netDevices,omitempty"`
}

type cdiMount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Type          string   `json:"type,omitempty"`
	Options       []string `json:"options,omitempty"`
}

func readCDISpec(t *testing.T, path string) *cdiSpec {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var s cdiSpec
	if err := dec.Decode(&s); err != nil {
		t.Fatalf("CDI spec %s: %v\n%s", path, err, b)
	}
	return &s
}

// cdiView applies the edits of the CDI devices ids (vendor/class=name)
// found in spec as a runtime does: the spec-wide edits, then each device's;
// env entries appended in order (a later one wins), mounts added.
func cdiView(t *testing.T, spec *cdiSpec, ids ...string) containerView {
	t.Helper()
	v := containerView{env: map[string]string{}}
	apply := func(e *cdiEdits) {
		for _, kv := range e.Env {
			k, val, ok := strings.Cut(kv, "=")
			if !ok {
				t.Fatalf("CDI env entry %q has no =", kv)
			}
			v.env[k] = val
		}
		for _, m := range e.Mounts {
			v.mounts = append(v.mounts, mountView{m.ContainerPath, m.HostPath, slices.Contains(m.Options, "ro")})
		}
	}
	if spec.ContainerEdits != nil {
		apply(spec.ContainerEdits)
	}
	for _, id := range ids {
		kind, name, ok := strings.Cut(id, "=")
		if !ok || kind != spec.Kind {
			t.Fatalf("CDI device %q is not of the spec's kind %q", id, spec.Kind)
		}
		found := false
		for i := range spec.Devices {
			if spec.Devices[i].Name == name {
				apply(&spec.Devices[i].ContainerEdits)
				found = true
			}
		}
		if !found {
			t.Fatalf("CDI device %q not in the spec (devices %+v)", id, spec.Devices)
		}
	}
	return v
}

// toHost maps a container path to the host through the mounts, as a
// container runtime would (the longest matching container path wins).
func toHost(v containerView, p string) (string, bool) {
	best := -1
	for i, m := range v.mounts {
		if (p == m.containerPath || strings.HasPrefix(p, m.containerPath+"/")) &&
			(best < 0 || len(m.containerPath) > len(v.mounts[best].containerPath)) {
			best = i
		}
	}
	if best < 0 {
		return "", false
	}
	m := v.mounts[best]
	return m.hostPath + p[len(m.containerPath):], true
}

// workerEnv is the container's env on this host: exactly the answer's env,
// container paths mapped through its mounts; /etc/ld.so.preload's library
// as LD_PRELOAD, the limits file by its env.
func workerEnv(t *testing.T, v containerView) []string {
	t.Helper()
	var out []string
	for k, val := range v.env {
		switch k {
		case "CUDA_DEVICE_MEMORY_SHARED_CACHE":
			h, ok := toHost(v, val)
			if !ok {
				t.Fatalf("%s=%s is under no mount: %+v", k, val, v.mounts)
			}
			out = append(out, k+"="+h)
		case "NVIDIA_VISIBLE_DEVICES":
			out = append(out, "CUDA_VISIBLE_DEVICES="+val)
		default:
			out = append(out, k+"="+val)
		}
	}
	preload, ok := toHost(v, "/etc/ld.so.preload")
	if !ok {
		t.Fatalf("no /etc/ld.so.preload mount: %+v", v.mounts)
	}
	b, err := os.ReadFile(preload)
	must(t, err)
	libs := strings.Fields(string(b))
	if len(libs) != 1 {
		t.Fatalf("ld.so.preload names %q", libs)
	}
	lib, ok := toHost(v, libs[0])
	if !ok {
		t.Fatalf("%s is under no mount", libs[0])
	}
	out = append(out, "LD_PRELOAD="+lib)
	if lim, ok := toHost(v, "/etc/vgpu/limits"); ok {
		out = append(out, "LIBVGPU_LIMITS_FILE="+lim)
	}
	return out
}

// holdBudget starts a worker with env on the simulated GPU: an allocation
// past budgetMiB must fail with CUDA_ERROR_OUT_OF_MEMORY, two within it
// succeed, and cuMemGetInfo's total is the budget. The worker stays up
// holding what it allocated (held, MiB) until a line is written to its
// stdin.
func holdBudget(t *testing.T, s *stack, env []string, budgetMiB int) (w *worker, held int) {
	t.Helper()
	beyond, a, b := budgetMiB+76, budgetMiB*600/1024, budgetMiB*100/1024
	w = startWorker(t, s, env, "init", "ctx", "0", "mem-info",
		"alloc", strconv.Itoa(beyond), "alloc", strconv.Itoa(a), "alloc", strconv.Itoa(b),
		"mem-info", "ready", "wait")
	w.expect(t, "ready", 60*time.Second)
	var allocs, totals []string
	for _, l := range w.seen {
		if strings.HasPrefix(l, "alloc") {
			allocs = append(allocs, l)
		}
		if f := strings.Fields(l); len(f) == 5 && f[0] == "mem" {
			totals = append(totals, f[4])
		}
	}
	if !reflect.DeepEqual(allocs, []string{"alloc err 2", "alloc ok", "alloc ok"}) {
		t.Errorf("allocations of %d, %d, %d MiB: %q; beyond the %d MiB budget CUDA_ERROR_OUT_OF_MEMORY, within it success",
			beyond, a, b, allocs, budgetMiB)
	}
	if len(totals) != 2 || totals[0] != strconv.Itoa(budgetMiB*mib) {
		t.Errorf("cuMemGetInfo totals %q, want the %d MiB budget", totals, budgetMiB)
	}
	return w, a + b
}

// smShare is the share of the device (percent) a kernel loop gets with
// env, against the same loop with no limit (no interposer, no SM limit)
// measured here and now.
func smShare(t *testing.T, s *stack, env []string, assigned int) float64 {
	t.Helper()
	var free []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "LD_PRELOAD=") && !strings.HasPrefix(kv, "CUDA_DEVICE_SM_LIMIT") {
			free = append(free, kv)
		}
	}
	const windowMs = 6000
	base := throughput(t, s, free, windowMs)
	limited := throughput(t, s, env, windowMs)
	share := 100 * limited / base
	t.Logf("SM share: %.1f %% of the device (%.0f kernels/s limited, %.0f free, %d ms each); assigned %d %%",
		share, limited, base, windowMs, assigned)
	return share
}

// release lets a worker from holdBudget finish.
func (w *worker) release() { _, _ = io.WriteString(w.stdin, "\n") }
