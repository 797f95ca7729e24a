// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
)

// TestFileSafety runs host-local through libcni with network names and container IDs
// that look like paths to an unwary plugin ("a..b", "x.-_y") and requires that every
// file it creates lies under <dataDir>/<network>, that lease files are readable by root
// only and directories writable by root only, and that DEL and GC leave no lease. The
// data dir must hold nothing but the network directories afterwards.
func TestFileSafety(t *testing.T) {
	h := nstest.New(t)
	pod := h.NewPod()
	for _, name := range []string{"a..b", "x.-_y", "net"} {
		t.Run(name, func(t *testing.T) {
			conf := h.Conflist(`{"cniVersion":"1.1.0","name":"` + name + `","plugins":[{"type":"host-local",
				"ipam":{"type":"host-local","ranges":[[{"subnet":"10.66.0.0/24"}],[{"subnet":"fd66::/64"}]],"dataDir":"@DATADIR@"}}]}`)
			rt := h.RT(pod, "eth0", nstest.WithContainerID("c.."+strings.ReplaceAll(name, ".", "-")))
			h.MustAdd(conf, rt)
			netDir := filepath.Join(h.DataDir, name)
			var leases int
			err := filepath.Walk(h.DataDir, func(p string, fi os.FileInfo, err error) error {
				if err != nil {
					return err
				}
				if p == h.DataDir {
					return nil
				}
				if fi.Mode()&os.ModeSymlink != 0 {
					t.Errorf("%s is a symlink", p)
				}
				if fi.IsDir() && fi.Mode().Perm()&0o022 != 0 {
					t.Errorf("directory %s is writable by group or others (%v)", p, fi.Mode().Perm())
				}
				if !fi.IsDir() && strings.HasPrefix(p, netDir+"/") && fi.Mode().Perm()&0o077 != 0 && !strings.HasPrefix(fi.Name(), "last_reserved_ip") {
					t.Errorf("file %s is accessible to group or others (%v)", p, fi.Mode().Perm())
				}
				if !fi.IsDir() && filepath.Dir(p) == netDir && (strings.Contains(fi.Name(), ".") || strings.Contains(fi.Name(), ":")) && !strings.HasPrefix(fi.Name(), "last_reserved_ip") {
					leases++
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if leases != 2 {
				t.Errorf("found %d lease files under %s, want 2 (one per family)", leases, netDir)
			}
			h.MustDel(conf, rt)
			if err := h.GC(conf, nil); err != nil {
				t.Fatalf("GC: %v", err)
			}
			entries, _ := os.ReadDir(netDir)
			for _, e := range entries {
				if strings.Count(e.Name(), ".") == 3 || strings.Contains(e.Name(), ":") {
					t.Errorf("lease %s left after DEL and GC", e.Name())
				}
			}
		})
	}
	// Nothing escaped: the data dir holds only the three network directories.
	entries, _ := os.ReadDir(h.DataDir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "a..b net x.-_y" {
		t.Fatalf("data dir holds %v, want only the three network directories", names)
	}
}
