// SPDX-License-Identifier: Apache-2.0

package disk_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/ipam"
	"github.com/podwire/podwire/pkg/ipam/disk"
)

// outsideTree lists everything under dir with file contents: what the store must
// never change.
func outsideTree(t *testing.T, dir string) string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		line := rel + " " + fi.Mode().String()
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			line += " " + strings.ReplaceAll(string(b), "\r\n", `\r\n`)
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// victimDir is a directory outside the data dir holding one file, victim, with a
// lease-like content and an address.
func victimDir(t *testing.T) (dir, file string) {
	dir = t.TempDir()
	file = filepath.Join(dir, "victim")
	if err := os.WriteFile(file, []byte("10.0.0.100"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, file
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func isSymlink(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.Mode()&os.ModeSymlink != 0
}

// exercise runs ADD, repeated ADD, CHECK, STATUS, DEL, GC and a rebuild of the index
// (a new boot) on the store, requiring that they all succeed.
func exercise(t *testing.T, dataDir string) {
	t.Helper()
	c := parse(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`)
	st := open(t, dataDir, disk.Options{})
	first := allocate(t, st, c, own("a"))
	if again := allocate(t, st, c, own("a")); !cmp.Equal(first, again) {
		t.Errorf("repeated ADD got %v, first %v", again, first)
	}
	allocate(t, st, c, own("b"))
	if err := ipam.Check(ctx, st, c, own("a"), nil); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := ipam.Status(ctx, st, c); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	if err := ipam.Release(ctx, st, own("a")); err != nil {
		t.Errorf("DEL: %v", err)
	}
	st = open(t, dataDir, disk.Options{BootID: "boot1"}) // rebuilds the index
	if got := leasesOf(t, st, own("b")); len(got) != 1 {
		t.Errorf("after a rebuild b holds %v", got)
	}
	if err := ipam.GC(ctx, st, nil); err != nil {
		t.Errorf("GC: %v", err)
	}
	if got := leasesOf(t, st, own("b")); got != nil {
		t.Errorf("after GC b holds %v", got)
	}
}

// TestSymlinkedIndex: a symlink in place of podwire's index directory, or of a
// directory or file in it, never makes the store write, move or read anything
// outside the network directory; the link is replaced by what podwire needs there.
func TestSymlinkedIndex(t *testing.T) {
	for _, name := range []string{".podwire", ".podwire/owners", ".podwire/spare", ".podwire/state", ".podwire/probe.tmp", ".podwire/spare/0"} {
		t.Run(name, func(t *testing.T) {
			dataDir := t.TempDir()
			dir := filepath.Join(dataDir, network)
			if strings.Contains(name, "/") {
				// Let podwire make its index (and a spare) first.
				st := open(t, dataDir, disk.Options{})
				allocate(t, st, parse(t, dual), own("x"))
				if err := ipam.Release(ctx, st, own("x")); err != nil {
					t.Fatal(err)
				}
				os.RemoveAll(filepath.Join(dir, name))
			}
			outside, victim := victimDir(t)
			target := outside
			if !strings.HasSuffix(name, "owners") && !strings.HasSuffix(name, "spare") && name != ".podwire" {
				target = victim
			}
			symlink(t, target, filepath.Join(dir, name))
			before := outsideTree(t, outside)
			exercise(t, dataDir)
			if d := cmp.Diff(before, outsideTree(t, outside)); d != "" {
				t.Errorf("the store changed files outside the data dir (-before +after):\n%s", d)
			}
			if !strings.HasPrefix(name, ".podwire/spare/") && !strings.HasSuffix(name, ".tmp") && isSymlink(filepath.Join(dir, name)) {
				t.Errorf("%s is still a symlink", name)
			}
		})
	}
}

// TestSymlinkedLockAndLastReserved: a symlink (dangling or not) in place of the lock
// file or of last_reserved_ip.0 is replaced by a regular file; nothing is created,
// written or read through it (the victim file holds an address: followed, it would
// move round-robin to 10.0.0.101).
func TestSymlinkedLockAndLastReserved(t *testing.T) {
	for _, name := range []string{"lock", "last_reserved_ip.0"} {
		for _, dangling := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s dangling=%v", name, dangling), func(t *testing.T) {
				dataDir := t.TempDir()
				dir := filepath.Join(dataDir, network)
				outside, victim := victimDir(t)
				if dangling {
					victim = filepath.Join(outside, "created")
				}
				symlink(t, victim, filepath.Join(dir, name))
				before := outsideTree(t, outside)
				st := open(t, dataDir, disk.Options{})
				c := parse(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`)
				if got := allocate(t, st, c, own("a")); !cmp.Equal(got, []string{"10.0.0.2"}) {
					t.Errorf("ADD got %v, want 10.0.0.2", got)
				}
				exercise(t, dataDir)
				if d := cmp.Diff(before, outsideTree(t, outside)); d != "" {
					t.Errorf("the store changed files outside the data dir (-before +after):\n%s", d)
				}
				if fi, err := os.Lstat(filepath.Join(dir, name)); err != nil || !fi.Mode().IsRegular() {
					t.Errorf("%s is not a regular file now: %v %v", name, fi.Mode(), err)
				}
			})
		}
	}
}

// TestSymlinkedLease: a lease file replaced by a symlink (to a file outside the data
// dir, or dangling) is never followed. Its address stays taken; DEL of the attachment
// the index records for it removes the link (not its target) and succeeds; a
// repeated ADD of that attachment returns the address and writes its lease file
// again; GC removes the link unless a valid attachment holds it; a link nobody's
// index names is removed by GC.
func TestSymlinkedLease(t *testing.T) {
	c := parse(t, `{"ranges":[[{"subnet":"10.0.0.0/29"}]]}`) // .2 - .6
	setup := func(t *testing.T, dangling bool) (dataDir, dir, outside string, st *disk.Store) {
		dataDir = t.TempDir()
		dir = filepath.Join(dataDir, network)
		st = open(t, dataDir, disk.Options{})
		allocate(t, st, c, own("a")) // .2
		allocate(t, st, c, own("b")) // .3
		outside, victim := victimDir(t)
		if err := os.WriteFile(victim, []byte("victim\r\neth0"), 0o600); err != nil {
			t.Fatal(err)
		}
		if dangling {
			victim = filepath.Join(outside, "gone")
		}
		for _, ip := range []string{"10.0.0.2", "10.0.0.5"} { // a's lease, and a stray
			os.Remove(filepath.Join(dir, ip))
			symlink(t, victim, filepath.Join(dir, ip))
		}
		return dataDir, dir, outside, st
	}
	for _, dangling := range []bool{false, true} {
		t.Run(fmt.Sprintf("DEL dangling=%v", dangling), func(t *testing.T) {
			_, dir, outside, st := setup(t, dangling)
			before := outsideTree(t, outside)
			if got := leasesOf(t, st, ipam.Owner{ContainerID: "victim", IfName: "eth0"}); got != nil {
				t.Errorf("the link's target was read as a lease: %v", got)
			}
			// The address stays taken: the next ADDs skip .2 and .5.
			for _, want := range []string{"10.0.0.4", "10.0.0.6"} {
				if got := allocate(t, st, c, own("n"+want)); !cmp.Equal(got, []string{want}) {
					t.Errorf("ADD got %v, want %s", got, want)
				}
			}
			if err := ipam.Release(ctx, st, own("a")); err != nil {
				t.Fatalf("DEL of the attachment whose lease is a symlink: %v (code %d)", err, cniplumb.Code(err))
			}
			if _, err := os.Lstat(filepath.Join(dir, "10.0.0.2")); !os.IsNotExist(err) {
				t.Errorf("DEL left the link: %v", err)
			}
			if err := ipam.GC(ctx, st, []ipam.Owner{own("b"), own("n10.0.0.4"), own("n10.0.0.6")}); err != nil {
				t.Fatalf("GC: %v", err)
			}
			if _, err := os.Lstat(filepath.Join(dir, "10.0.0.5")); !os.IsNotExist(err) {
				t.Errorf("GC left the stray link: %v", err)
			}
			if got := allocate(t, st, c, own("c")); !cmp.Equal(got, []string{"10.0.0.2"}) {
				t.Errorf("ADD after the links are gone got %v, want 10.0.0.2", got)
			}
			if d := cmp.Diff(before, outsideTree(t, outside)); d != "" {
				t.Errorf("changed outside the data dir (-before +after):\n%s", d)
			}
		})
	}
	t.Run("repeated ADD", func(t *testing.T) {
		_, dir, outside, st := setup(t, false)
		before := outsideTree(t, outside)
		if got := allocate(t, st, c, own("a")); !cmp.Equal(got, []string{"10.0.0.2"}) {
			t.Errorf("repeated ADD got %v, want a's 10.0.0.2", got)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "10.0.0.2")); err != nil || string(b) != "a\r\neth0" || isSymlink(filepath.Join(dir, "10.0.0.2")) {
			t.Errorf("a's lease file is %q, %v (symlink %v)", b, err, isSymlink(filepath.Join(dir, "10.0.0.2")))
		}
		if d := cmp.Diff(before, outsideTree(t, outside)); d != "" {
			t.Errorf("changed outside the data dir (-before +after):\n%s", d)
		}
	})
	t.Run("GC keeps a valid attachment's", func(t *testing.T) {
		_, dir, _, st := setup(t, true)
		if err := ipam.GC(ctx, st, []ipam.Owner{own("a"), own("b")}); err != nil {
			t.Fatalf("GC: %v", err)
		}
		if !isSymlink(filepath.Join(dir, "10.0.0.2")) {
			t.Error("GC removed the link in place of valid a's lease")
		}
		if isSymlink(filepath.Join(dir, "10.0.0.5")) {
			t.Error("GC kept the stray link")
		}
		if err := ipam.Check(ctx, st, c, own("a"), nil); err != nil {
			t.Errorf("CHECK of a: %v", err)
		}
	})
}

// TestUnreadableLeaseRequested: requesting an address whose lease file is a symlink
// fails naming the problem, with code 7, not an I/O error.
func TestUnreadableLeaseRequested(t *testing.T) {
	dataDir := t.TempDir()
	dir := filepath.Join(dataDir, network)
	symlink(t, "/nonexistent", filepath.Join(dir, "10.0.0.7"))
	c, err := ipam.ParseConf([]byte(`{"cniVersion":"1.1.0","name":"`+network+`","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}]]},"args":{"cni":{"ips":["10.0.0.7"]}}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = ipam.Allocate(ctx, open(t, dataDir, disk.Options{}), c, own("a"))
	if cniplumb.Code(err) != cniplumb.CodeInvalidConfig || !strings.Contains(err.Error(), "not a lease file") {
		t.Errorf("requesting an address blocked by a symlink: %v (code %d)", err, cniplumb.Code(err))
	}
}

// TestDirectoryInTheWay: podwire never removes a directory it did not make. One in
// place of the lock file or last_reserved_ip.0 fails the call with code 5 saying to
// remove it; one in place of a lease file keeps its address taken, and DEL of the
// attachment that held it succeeds.
func TestDirectoryInTheWay(t *testing.T) {
	c := parse(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`)
	for _, name := range []string{"lock", "last_reserved_ip.0"} {
		dataDir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dataDir, network, name, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := ipam.Allocate(ctx, open(t, dataDir, disk.Options{}), c, own("a"))
		if cniplumb.Code(err) != cniplumb.CodeIOFailure || !strings.Contains(err.Error(), "remove it") {
			t.Errorf("ADD with a directory as %s: %v (code %d), want code 5 saying to remove it", name, err, cniplumb.Code(err))
		}
	}
	dataDir := t.TempDir()
	st := open(t, dataDir, disk.Options{})
	allocate(t, st, c, own("a")) // .2
	lease := filepath.Join(dataDir, network, "10.0.0.2")
	if err := os.Remove(lease); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(lease, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := allocate(t, st, c, own("b")); !cmp.Equal(got, []string{"10.0.0.3"}) {
		t.Errorf("ADD next to a directory at 10.0.0.2 got %v", got)
	}
	if err := ipam.Release(ctx, st, own("a")); err != nil {
		t.Errorf("DEL of the attachment whose lease is now a directory: %v", err)
	}
	if err := ipam.GC(ctx, st, nil); err != nil {
		t.Errorf("GC: %v", err)
	}
	if _, err := os.Stat(filepath.Join(lease, "x")); err != nil {
		t.Errorf("the directory was removed: %v", err)
	}
}

// TestIndexDirectoryReplaced: when .podwire/owners is removed or replaced by a symlink
// while leases exist, the next call rebuilds the index from the lease files, so the
// leases are still found (a repeated ADD returns them, DEL releases them).
func TestIndexDirectoryReplaced(t *testing.T) {
	for _, link := range []bool{false, true} {
		t.Run(fmt.Sprintf("symlink=%v", link), func(t *testing.T) {
			dataDir := t.TempDir()
			st := open(t, dataDir, disk.Options{})
			c := parse(t, dual)
			first := allocate(t, st, c, own("a"))
			owners := filepath.Join(dataDir, network, ".podwire", "owners")
			if err := os.RemoveAll(owners); err != nil {
				t.Fatal(err)
			}
			if link {
				symlink(t, t.TempDir(), owners)
			}
			if again := allocate(t, st, c, own("a")); !cmp.Equal(first, again) {
				t.Errorf("repeated ADD after the index directory was replaced got %v, first %v", again, first)
			}
			if err := ipam.Release(ctx, st, own("a")); err != nil {
				t.Fatal(err)
			}
			if got := files(t, filepath.Join(dataDir, network)); strings.Contains(got, "a\\r\\neth0") {
				t.Errorf("DEL left a lease:\n%s", got)
			}
		})
	}
}
