// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/podwire/podwire/integration/nstest"
)

// demoSteps are what a successful `make demo` prints.
var demoSteps = []string{
	"[7/7]", "pod-a -> pod-b", "from outside client", "via 127.0.0.1",
	"shaped both ways: each TBF sent within 10 Mbit/s", "equals the snapshot before the pods", "✓ demo finished",
}

// runDemo runs `make demo`'s program with extra environment and returns its output
// and error.
func runDemo(t *testing.T, env ...string) (string, error) {
	t.Helper()
	nstest.RequireRoot(t)
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "./integration/demo")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func requireDemoPassed(t *testing.T, out string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	for _, want := range demoSteps {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
}

// TestDemo runs `make demo`'s program end to end and requires it to exit 0 with every
// step reported, so the main job cannot silently break.
func TestDemo(t *testing.T) {
	out, err := runDemo(t)
	requireDemoPassed(t, out, err)
	t.Logf("shaping step:\n%s", shapingLines(out))
}

// TestDemoUnderCPULoad runs the demo while a busy loop spins on every CPU beside it
// (what stress-ng --cpu N does), at the demo's own priority: the shaping step must
// still pass, because it judges the kernel's shaper from its own counters.
func TestDemoUnderCPULoad(t *testing.T) {
	nstest.RequireRoot(t)
	var stop atomic.Bool
	var wg sync.WaitGroup
	loops := make([]uint64, runtime.NumCPU())
	var before syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	start := time.Now()
	for i := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := uint64(0)
			for !stop.Load() {
				n++
			}
			loops[i] = n
		}()
	}
	out, err := runDemo(t)
	stop.Store(true)
	wg.Wait()
	var after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano() - before.Utime.Nano())
	t.Logf("%d busy loops beside the demo used %s of CPU in %s of wall time (%.1f CPUs on average)",
		len(loops), cpu.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), cpu.Seconds()/time.Since(start).Seconds())
	requireDemoPassed(t, out, err)
	t.Logf("shaping step under load:\n%s", shapingLines(out))
}

// TestDemoFailsWithoutShaping runs the demo with the bandwidth plugin left out of the
// conflist: pod B runs at whatever the veth does, and the demo must fail at its
// throughput step, saying the pod is not shaped.
func TestDemoFailsWithoutShaping(t *testing.T) {
	out, err := runDemo(t, "PODWIRE_DEMO_NO_SHAPING=1")
	if err == nil {
		t.Fatalf("the demo passed with shaping switched off:\n%s", out)
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("demo: %v, want exit status 1 from its throughput step\n%s", err, out)
	}
	for _, want := range []string{"the bandwidth plugin is left out", "step 6 (Pod B throughput", "not shaped", "no TBF"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("shaping step without shaping:\n%s", shapingLines(out))
}

func shapingLines(out string) string {
	var l []string
	for _, s := range strings.Split(out, "\n") {
		if strings.Contains(s, "TBF") || strings.Contains(s, "shaped") {
			l = append(l, s)
		}
	}
	return strings.Join(l, "\n")
}
