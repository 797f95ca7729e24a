// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/podwire/podwire/integration/containerd"
	"github.com/podwire/podwire/integration/nstest"
)

// TestPodwireCRI runs podwire against Debian's containerd: gc --dry-run --cri must
// keep the runtime's live sandbox (valid through ListPodSandbox) and list the DEL of
// an attachment the runtime does not know, and doctor must name the runtime and what
// its CNI layer calls.
func TestPodwireCRI(t *testing.T) {
	nstest.RequireRoot(t)
	if missing := containerd.Missing(); len(missing) > 0 {
		nstest.Missing(t, "the podwire CRI test needs Debian packages %s (.ci/run installs them)", strings.Join(missing, ", "))
	}
	h := nstest.New(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	conf := loadKubenetExample(t, h, repo)
	confDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(confDir, "10-kubenet.conflist"), conf.raw, 0o644); err != nil {
		t.Fatal(err)
	}
	d := containerd.Start(t, containerd.Options{NetNS: h.HostNS.Path(), CNIBinDir: h.BinDir, CNIConfDir: confDir, Dir: t.TempDir(), Repo: repo})
	requireCRIReady(t, d)
	live := runPod(t, d, "live", conf)
	t.Cleanup(func() {
		d.MustCrictl("stopp", live)
		d.MustCrictl("rmp", live)
	})
	// An attachment of the same network that containerd does not know (a runtime
	// restart lost it), in the libcni cache containerd uses.
	list, err := libcni.NetworkConfFromBytes(conf.raw)
	if err != nil {
		t.Fatal(err)
	}
	c := libcni.NewCNIConfigWithCacheDir([]string{h.BinDir}, containerd.LibcniCacheDir, nil)
	pod := h.NewPod()
	rt := h.RT(pod, "eth0", nstest.WithContainerID(h.Prefix+"-lost"))
	if _, err := h.AddWith(c, list, rt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.DelWith(c, list, rt) })

	args := []string{"--conf-dir", confDir, "--bin-dir", h.BinDir, "--cache-dir", containerd.LibcniCacheDir}
	var plan cliPlan
	cliJSON(t, h.HostNS.Path(), &plan, append([]string{"gc", "--dry-run", "--json", "--cri", d.Socket}, args...)...)
	var dels []string
	for _, r := range plan.Removals {
		if strings.Contains(r.Owner, live) || strings.Contains(r.Name, live) {
			t.Errorf("the dry run removes %+v of containerd's live sandbox", r)
		}
		if r.Kind == "del" {
			dels = append(dels, r.Name)
		}
	}
	if want := []string{h.Prefix + "-lost/eth0"}; fmt.Sprint(dels) != fmt.Sprint(want) {
		t.Errorf("dry run DELs %v, want %v (removals %+v, notes %v)", dels, want, plan.Removals, plan.Notes)
	}

	var rep struct {
		Checks []cliCheck `json:"checks"`
	}
	out, errs, code := runCLI(t, h.HostNS.Path(), append([]string{"doctor", "--json", "--cri", d.Socket}, args...)...)
	if code > 1 {
		t.Fatalf("doctor: exit %d\n%s%s", code, out, errs)
	}
	cliJSONText(t, out, &rep)
	found := false
	for _, c := range rep.Checks {
		found = found || c.Name == "runtime" && strings.Contains(c.Detail, "containerd") && strings.Contains(c.Detail, "CRI "+d.Socket) && strings.Contains(c.Detail, "GC")
	}
	if !found {
		t.Errorf("doctor does not report containerd through %s: %+v", d.Socket, rep.Checks)
	}
}
