//go:build hamivalues

// A check run by hand, never in ./scripts/test (a skipped test there is a
// failure): HAMi's own values file is HAMi's, not ours to commit.
//
//	VGPU_E2E_HAMI_VALUES=/path/to/hami/charts/hami/values.yaml \
//	  go test -tags hamivalues -run TestChartAppliesWithHAMisOwnValuesFile ./

package e2e

import (
	"os"
	"strings"
	"testing"
)

// HAMi's own charts/hami/values.yaml of v2.10.0 is not in this repository
// (it is HAMi's); given its path in VGPU_E2E_HAMI_VALUES, vgpu's chart
// renders it, lints it strictly and the API server takes every object.
func TestChartAppliesWithHAMisOwnValuesFile(t *testing.T) {
	f := os.Getenv("VGPU_E2E_HAMI_VALUES")
	if f == "" {
		t.Fatal("VGPU_E2E_HAMI_VALUES (a copy of HAMi v2.10.0's charts/hami/values.yaml) is not set")
	}
	out := helm(t, "lint", "--strict", chartDir(), "-f", f)
	if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
		t.Errorf("helm lint --strict -f %s:\n%s", f, out)
	}
	ensureNamespace(t, "hami-own")
	objs := render(t, "hami", "hami-own", "-f", f)
	mustFind(t, objs, "Service", "hami-scheduler")
	mustFind(t, objs, "Service", "hami-device-plugin-monitor")
	apply(t, objs, false)
}
