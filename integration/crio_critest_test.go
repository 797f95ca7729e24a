// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/podwire/podwire/integration/containerd"
	"github.com/podwire/podwire/integration/crio"
	"github.com/podwire/podwire/integration/nstest"
)

// critestImage is the one image critest's Networking specs get (no registry is
// reachable): Debian's static busybox with the applets the specs exec (top as the
// default container's command, cat /etc/resolv.conf, hostname) and, as its entrypoint,
// busybox's httpd on port 80 serving an index page (the web server specs).
const critestImage = "podwire.test/busybox:e2e"

// TestCRIOCritest runs cri-tools' critest (CritestVersion) Networking specs against
// CRI-O with podwire's kubenet conflist: DNS config, hostname, a port mapping with only
// a container port (reached at the pod IP) and one with a host port (reached at
// 127.0.0.1:12000, with the node's localhost prerequisites set). critest runs in the
// node netns, as a node's own process would. Afterwards no pod, lease, libcni cache
// entry or node state of them is left.
func TestCRIOCritest(t *testing.T) {
	h := nstest.New(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		nstest.Missing(t, "critest's image needs Debian's busybox-static (/bin/busybox): apt-get install busybox-static (.ci/run installs it): %v", err)
	}
	start := time.Now()
	critest, err := crio.EnsureCritest(repo)
	if err != nil {
		nstest.Missing(t, "critest %s: %v", crio.CritestVersion, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Logf("built critest %s from the Go module proxy in %s (cached as %s)", crio.CritestVersion, d.Round(time.Second), critest)
	}
	img := containerd.Image{Name: critestImage, Entrypoint: []string{"/bin/busybox", "httpd", "-f", "-p", "80", "-h", "/www"},
		Files: []containerd.File{{Path: "/www/index.html", Mode: 0o644, Data: []byte("podwire critest\n")}}}
	for _, applet := range []string{"busybox", "sh", "top", "cat", "hostname"} {
		img.Files = append(img.Files, containerd.File{Path: "/bin/" + applet, Mode: 0o755, Data: busybox})
	}
	conf := crioKubenet(t, h, repo, "1.1.0", nil)
	for _, args := range crioLocalhostPrereqs {
		h.Run(h.HostNS, args[0], args[1:]...)
	}
	d := startCRIO(t, h, repo, conf, crio.Options{Images: []containerd.Image{img}})
	crioWaitNetwork(t, d, true, 30*time.Second)
	warm := crioRun(t, d, "warm", map[string]any{
		"port_mappings": []map[string]any{{"protocol": 0, "container_port": 80, "host_port": 12001}},
	})
	waitNoTentative(t, h)
	d.MustCrictl("stopp", warm)
	d.MustCrictl("rmp", warm)
	before := settledSnapshot(t, h)

	images := filepath.Join(t.TempDir(), "images.yaml")
	if err := os.WriteFile(images, []byte("defaultTestContainerImage: "+critestImage+"\nwebServerTestImage: "+critestImage+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := []string{"--net=" + h.HostNS.Path(), critest,
		"-runtime-endpoint=unix://" + d.Socket, "-image-endpoint=unix://" + d.Socket,
		"-test-images-file=" + images, "-ginkgo.focus=Networking", "-ginkgo.no-color", "-ginkgo.v"}
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Dir = t.TempDir()
	began := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(began)
	ran := regexp.MustCompile(`Ran (\d+) of (\d+) Specs`).FindString(string(out))
	if err != nil || !strings.Contains(string(out), "SUCCESS!") || !strings.HasPrefix(ran, "Ran 4 ") {
		t.Fatalf("critest %s: %v (%s)\n%s", strings.Join(args[1:], " "), err, ran, tail(string(out), 80))
	}
	var specs []string
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`(runtime should support [^\[\n]*) \[Conformance\]`).FindAllStringSubmatch(string(out), -1) {
		if name := strings.TrimSpace(m[1]); !seen[name] {
			seen[name] = true
			specs = append(specs, name)
		}
	}
	t.Logf("check: critest %s -ginkgo.focus=Networking against %s with podwire's conflist: %s in %s, SUCCESS (%s)",
		crio.CritestVersion, d.Version, ran, took.Round(100*time.Millisecond), strings.Join(specs, "; "))

	if pods := strings.TrimSpace(d.MustCrictl("pods", "-q")); pods != "" {
		t.Errorf("critest left pods: %s", pods)
	}
	if leases, _ := os.ReadDir(filepath.Join(h.DataDir, conf.network)); len(leases) > 0 {
		var names []string
		for _, l := range leases {
			names = append(names, l.Name())
		}
		// host-local keeps last_reserved_ip.0, its lock and its own dot files; anything
		// else is a lease.
		for _, n := range names {
			if n != "lock" && !strings.HasPrefix(n, "last_reserved_ip") && !strings.HasPrefix(n, ".") {
				t.Errorf("leases left after critest: %v", names)
				break
			}
		}
	}
	if m, _ := filepath.Glob(filepath.Join(e2eLibcniCache, "results", conf.network+"-*")); len(m) > 0 {
		t.Errorf("libcni cache entries left after critest: %v", m)
	}
	requireSettledUnchanged(t, h, before)
	t.Logf("check: after critest no pod, lease or libcni cache entry of network %s is left, and the node state is as before it", conf.network)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
