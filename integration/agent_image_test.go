// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podwire/podwire/integration/containerd"
	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/agent/cri"
	"github.com/podwire/podwire/pkg/runtimes"
)

// TestAgentImageAndCRI builds podwire-agent's OCI image as `make image` does (the
// init, the agent and the plugins, hack/mkimage), imports it with Debian's `ctr images
// import` into a private containerd, checks that its entrypoint runs the agent under
// podwire-init, and checks the agent's CRI client against that containerd: the Version
// RPC names a runtime pkg/runtimes knows, and ListPodSandbox answers.
func TestAgentImageAndCRI(t *testing.T) {
	nstest.RequireRoot(t)
	if missing := containerd.Missing(); len(missing) > 0 {
		nstest.Missing(t, "the agent image test needs Debian packages %s (.ci/run installs them)", strings.Join(missing, ", "))
	}
	h := nstest.New(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	agent, initBin := filepath.Join(dir, "podwire-agent"), filepath.Join(dir, "podwire-init")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", dir+"/", "./cmd/podwire-agent", "./cmd/podwire-init")
	build.Dir, build.Env = repo, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the agent and its init: %v\n%s", err, out)
	}
	tarPath := filepath.Join(dir, "agent.oci.tar")
	const name = "docker.io/podwire/podwire-agent:test"
	mk := exec.Command("go", "run", "./hack/mkimage", "-agent", agent, "-init", initBin, "-plugins", h.BinDir, "-name", name, "-o", tarPath)
	mk.Dir = repo
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("hack/mkimage: %v\n%s", err, out)
	}

	confDir := filepath.Join(dir, "net.d")
	os.MkdirAll(confDir, 0o755)
	d := containerd.Start(t, containerd.Options{NetNS: h.HostNS.Path(), CNIBinDir: h.BinDir, CNIConfDir: confDir, Dir: t.TempDir(), Repo: repo})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ctr", "--address", d.Socket, "--namespace", "k8s.io", "images", "import", tarPath).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	info, err := d.Crictl("inspecti", name)
	if err != nil {
		t.Fatalf("crictl inspecti %s: %v\n%s", name, err, info)
	}
	// The DaemonSet passes args only, so they follow this entrypoint: the agent runs
	// under podwire-init, its PID 1 (cmd/podwire-agent/README.md, "PID 1").
	var img struct {
		Info struct {
			ImageSpec struct {
				Config struct{ Entrypoint, Cmd []string }
			}
		}
	}
	if err := json.Unmarshal([]byte(info), &img); err != nil {
		t.Fatalf("crictl inspecti %s: %v\n%s", name, err, info)
	}
	if ep := img.Info.ImageSpec.Config; !slices.Equal(ep.Entrypoint, []string{"/podwire-init", "/podwire-agent"}) || len(ep.Cmd) != 0 {
		t.Errorf("image entrypoint %q cmd %q, want [/podwire-init /podwire-agent] and no cmd", ep.Entrypoint, ep.Cmd)
	}
	ls, _ := exec.CommandContext(ctx, "ctr", "--address", d.Socket, "--namespace", "k8s.io", "images", "check", "name=="+name).CombinedOutput()
	if !strings.Contains(string(ls), "complete") {
		t.Errorf("ctr images check: %s", ls)
	}

	c, err := cri.Dial(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rn, rv, err := c.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	caps := runtimes.Lookup(rn, rv)
	t.Logf("CRI Version: %s %s -> %s, cniVersion %s", rn, rv, caps.Source, caps.MaxCNIVersion)
	if !caps.Known {
		t.Errorf("pkg/runtimes does not know %s %s", rn, rv)
	}
	if !strings.Contains(d.Version, rv) {
		t.Errorf("CRI version %q is not containerd --version %q", rv, d.Version)
	}
	if _, err := c.Sandboxes(ctx); err != nil {
		t.Errorf("ListPodSandbox: %v", err)
	}
}
