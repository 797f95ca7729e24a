// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/podwire/podwire/integration/nstest"
)

const churnConf = `{"cniVersion":"1.1.0","name":"@PREFIX@-churn","plugins":[
 {"type":"bridge","bridge":"@PREFIX@br","isGateway":true,"ipMasq":true,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.77.0.0/22"}]],"dataDir":"@DATADIR@"}},
 {"type":"portmap","capabilities":{"portMappings":true}},
 {"type":"bandwidth","capabilities":{"bandwidth":true}}]}`

// TestChurn adds and deletes many attachments concurrently with random hostPorts and
// bandwidth limits while a wrapper in CNI_PATH SIGKILLs a fraction of plugin processes
// (host-local under bridge included) at random moments of ADD and DEL. A failed ADD is
// followed by DEL, a failed DEL is retried, as runtimes do. It requires that no
// address is ever held by two live attachments, and that after a final DEL of every
// attachment and one GC the node is exactly as before. PODWIRE_STRESS=1 (make stress)
// runs the long version.
func TestChurn(t *testing.T) {
	h := nstest.New(t)
	for _, p := range []string{"bridge", "host-local", "portmap", "bandwidth"} {
		if _, err := os.Stat(filepath.Join(h.BinDir, p)); err != nil {
			t.Fatalf("plugin %s is missing from %s: %v", p, h.BinDir, err)
		}
	}
	n, workers, prob := 48, 8, 0.12
	if os.Getenv("PODWIRE_STRESS") != "" {
		n, workers = 600, 24
	}
	wrapDir, killLog := killWrapDir(t, h.BinDir)
	t.Setenv("PODWIRE_REAL_CNI_DIR", h.BinDir)
	t.Setenv("PODWIRE_KILL_LOG", killLog)
	t.Setenv("PODWIRE_KILL_MAX_MS", "30")
	t.Setenv("PODWIRE_KILL_PROB", fmt.Sprint(prob))

	conf := h.Conflist(churnConf)
	clean := h.CNI
	killing := libcni.NewCNIConfigWithCacheDir([]string{wrapDir}, t.TempDir(), nil)

	// A first pod (with a host port, so every node-level knob is exercised) creates the
	// bridge, which stays by design; the baseline is taken after it has settled.
	pmWarmUp(t, h, conf)
	before := h.Snapshot()

	var (
		mu       sync.Mutex
		live     = map[string]string{} // IP -> container ID
		failures []string
		adds     int
	)
	fail := func(format string, a ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, a...))
		mu.Unlock()
	}
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		// Each worker reuses one pod netns: an attachment's DEL must leave it clean
		// enough for the next ADD of the same interface name, killed or not.
		pod := h.NewPod()
		go func() {
			defer wg.Done()
			for i := range jobs {
				caps := map[string]any{}
				if rand.IntN(2) == 0 {
					caps["portMappings"] = []map[string]any{{"hostPort": 30000 + i, "containerPort": 80, "protocol": []string{"tcp", "udp"}[i%2]}}
				}
				if rand.IntN(2) == 0 {
					rate := (1 + rand.IntN(100)) * 1_000_000
					caps["bandwidth"] = map[string]any{"ingressRate": rate, "ingressBurst": 4294967295, "egressRate": rate, "egressBurst": 0}
				}
				rt := h.RT(pod, "eth0", nstest.WithContainerID(fmt.Sprintf("churn-%d", i)), nstest.WithCaps(caps))
				res, err := h.AddWith(killing, conf, rt)
				if err == nil {
					mu.Lock()
					adds++
					for _, ipc := range res.IPs {
						ip := ipc.Address.IP.String()
						if other, ok := live[ip]; ok {
							failures = append(failures, fmt.Sprintf("%s got %s, already held by live %s", rt.ContainerID, ip, other))
						}
						live[ip] = rt.ContainerID
					}
					mu.Unlock()
				}
				// DEL through the killing wrapper, then retry cleanly until it succeeds.
				_ = h.DelWith(killing, conf, rt)
				var derr error
				for try := 0; try < 3; try++ {
					if derr = h.DelWith(clean, conf, rt); derr == nil {
						break
					}
				}
				if derr != nil {
					fail("DEL %s keeps failing: %v", rt.ContainerID, derr)
				}
				mu.Lock()
				for ip, id := range live {
					if id == rt.ContainerID {
						delete(live, ip)
					}
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d failures:\n%s", len(failures), strings.Join(failures, "\n"))
	}
	if err := h.GC(conf, nil); err != nil {
		t.Fatalf("GC with no valid attachments: %v", err)
	}
	kills, _ := os.ReadFile(killLog)
	nk := strings.Count(string(kills), "\n")
	t.Logf("churned %d attachments with %d workers: %d ADDs completed, %d plugin processes SIGKILLed mid-operation", n, workers, adds, nk)
	if nk == 0 {
		t.Errorf("no plugin process was killed: the kill wrapper is not in the path")
	}
	pmSettle(t, h)
	h.RequireUnchanged(before)
}

// killWrapDir builds killwrap and installs it under every plugin name in a new
// directory, returning it and the path of the kill log.
func killWrapDir(t *testing.T, realDir string) (string, string) {
	t.Helper()
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, ".killwrap")
	cmd := exec.Command("go", "build", "-o", bin, "./integration/reliability/killwrap")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building killwrap: %v\n%s", err, out)
	}
	entries, _ := os.ReadDir(realDir)
	for _, e := range entries {
		if err := os.Symlink(bin, filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	return dir, filepath.Join(t.TempDir(), "kills.log")
}
