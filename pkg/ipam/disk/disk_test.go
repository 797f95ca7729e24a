// SPDX-License-Identifier: Apache-2.0

package disk_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/ipam"
	"github.com/podwire/podwire/pkg/ipam/disk"
)

const network = "net1"

var ctx = context.Background()

func open(t testing.TB, dataDir string, opts disk.Options) *disk.Store {
	t.Helper()
	if opts.BootID == "" {
		opts.BootID = "boot0"
	}
	s, err := disk.Open(dataDir, network, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func parse(t testing.TB, ipamJSON string) *ipam.Conf {
	t.Helper()
	c, err := ipam.ParseConf([]byte(`{"cniVersion":"1.1.0","name":"`+network+`","ipam":`+ipamJSON+`}`), "")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const dual = `{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]}`

func own(id string) ipam.Owner { return ipam.Owner{ContainerID: id, IfName: "eth0"} }

func allocate(t testing.TB, st ipam.Store, c *ipam.Conf, o ipam.Owner) []string {
	t.Helper()
	a, err := ipam.Allocate(ctx, st, c, o)
	if err != nil {
		t.Fatalf("ADD %s: %v", o, err)
	}
	var out []string
	for _, x := range a {
		out = append(out, x.Address.IP.String())
	}
	return out
}

func leasesOf(t testing.TB, st ipam.Store, o ipam.Owner) []string {
	t.Helper()
	var out []string
	err := st.Do(ctx, func(tx ipam.Tx) error {
		ls, err := tx.Leases(o)
		for _, l := range ls {
			out = append(out, l.IP.String())
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// files lists the network directory: "name mode content" for each file, with the
// index directory's files under ".podwire/".
func files(t testing.TB, dir string) string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if fi.IsDir() {
			out = append(out, rel+"/ "+fi.Mode().Perm().String())
			return nil
		}
		line := rel + " " + fi.Mode().Perm().String()
		if !strings.HasPrefix(rel, ".podwire/owners/") && rel != ".podwire/state" {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += " " + strings.ReplaceAll(string(b), "\r\n", `\r\n`)
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, "\n")
}

func TestOnDiskLayout(t *testing.T) {
	dataDir := t.TempDir()
	st := open(t, dataDir, disk.Options{})
	allocate(t, st, parse(t, dual), own("c0ffee"))
	dir := filepath.Join(dataDir, network)
	got := files(t, dir)
	// The lease and last_reserved_ip files are exactly what the reference writes;
	// podwire's index lives in .podwire/.
	owners := filepath.Join(dir, ".podwire", "owners")
	ents, _ := os.ReadDir(owners)
	if len(ents) != 1 {
		t.Fatalf("owners/ has %d entries, want 1", len(ents))
	}
	want := `./ -rwxr-xr-x
.podwire/ -rwx------
.podwire/owners/ -rwx------
.podwire/owners/` + ents[0].Name() + ` -rw-------
.podwire/spare/ -rwx------
.podwire/state -rw-------
10.0.0.2 -rw------- c0ffee\r\neth0
fd00::2 -rw------- c0ffee\r\neth0
last_reserved_ip.0 -rw------- 10.0.0.2
last_reserved_ip.1 -rw------- fd00::2
lock -rw------- `
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("layout (-want +got):\n%s", d)
	}
	// The two leases are separate files, not links of one inode.
	a, _ := os.Stat(filepath.Join(dir, "10.0.0.2"))
	b, _ := os.Stat(filepath.Join(dir, "fd00::2"))
	if os.SameFile(a, b) {
		t.Error("the v4 and v6 leases share an inode")
	}
	ipam.Release(ctx, st, own("c0ffee"))
	// The freed inodes wait, emptied, in spare/ for the next ADD.
	want = `./ -rwxr-xr-x
.podwire/ -rwx------
.podwire/owners/ -rwx------
.podwire/spare/ -rwx------
.podwire/spare/0 -rw------- 
.podwire/spare/1 -rw------- 
.podwire/spare/2 -rw------- 
.podwire/state -rw-------
last_reserved_ip.0 -rw------- 10.0.0.2
last_reserved_ip.1 -rw------- fd00::2
lock -rw------- `
	if d := cmp.Diff(want, files(t, dir)); d != "" {
		t.Errorf("after DEL (-want +got):\n%s", d)
	}
	allocate(t, st, parse(t, dual), own("beef"))
	if got := files(t, dir); strings.Contains(got, "spare/0") {
		t.Errorf("ADD did not reuse the three spare inodes:\n%s", got)
	}
}

func TestOpenRefusesPathsOutsideDataDir(t *testing.T) {
	for _, n := range []string{"", ".", "..", "../x", "a/b", "x\x00y"} {
		if _, err := disk.Open(t.TempDir(), n, disk.Options{}); cniplumb.Code(err) != cniplumb.CodeInvalidConfig {
			t.Errorf("network %q: %v, want a code-7 error", n, err)
		}
	}
	if _, err := disk.Open("relative", "n", disk.Options{}); err == nil {
		t.Error("relative dataDir accepted")
	}
}

// TestSymlinkNotFollowed: a symlink planted as last_reserved_ip.0 or as a lease
// does not make the store write outside its directory: the first is replaced, the
// second's address is skipped (symlink_test.go has the other cases).
func TestSymlinkNotFollowed(t *testing.T) {
	dataDir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(outside, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(dataDir, network)
	os.MkdirAll(dir, 0o755)
	os.Symlink(outside, filepath.Join(dir, "last_reserved_ip.0"))
	os.Symlink(outside, filepath.Join(dir, "10.0.0.2"))
	st := open(t, dataDir, disk.Options{})
	if got := allocate(t, st, parse(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`), own("a")); !cmp.Equal(got, []string{"10.0.0.3"}) {
		t.Errorf("ADD got %v, want 10.0.0.3 (10.0.0.2 is taken by the symlink)", got)
	}
	if b, _ := os.ReadFile(outside); string(b) != "precious" {
		t.Errorf("file outside the data dir was changed to %q", b)
	}
}

// TestIndexNotRebuiltForOwnChanges proves ADD and DEL use the index rather than
// reading the lease directory: a planted stale index entry survives them (a rebuild
// would delete it). A foreign change is caught up with without a rebuild either; the
// next boot's rebuild removes the entry.
func TestIndexNotRebuiltForOwnChanges(t *testing.T) {
	dataDir := t.TempDir()
	st := open(t, dataDir, disk.Options{})
	c := parse(t, dual)
	allocate(t, st, c, own("a"))
	bogus := filepath.Join(dataDir, network, ".podwire", "owners", "0000000000000000000000000000000000000000")
	if err := os.WriteFile(bogus, []byte(`{"containerID":"ghost","ifName":"eth0","leases":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		allocate(t, st, c, own("b"))
		if err := ipam.Release(ctx, st, own("b")); err != nil {
			t.Fatal(err)
		}
		if err := ipam.Check(ctx, st, c, own("a"), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(bogus); err != nil {
		t.Fatalf("the index was rebuilt by our own ADD/DEL/CHECK: %v", err)
	}
	// A lease created behind our back (a later mtime tick) triggers a rebuild.
	time.Sleep(20 * time.Millisecond)
	if err := os.WriteFile(filepath.Join(dataDir, network, "10.0.0.200"), []byte("other\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := leasesOf(t, st, own("other")); !cmp.Equal(got, []string{"10.0.0.200"}) {
		t.Errorf("foreign lease not picked up: %v", got)
	}
	if _, err := os.Stat(bogus); err != nil {
		t.Fatalf("catching up with a foreign lease rebuilt the whole index: %v", err)
	}
	if got := leasesOf(t, open(t, dataDir, disk.Options{BootID: "boot1"}), own("other")); !cmp.Equal(got, []string{"10.0.0.200"}) {
		t.Errorf("after a reboot: %v", got)
	}
	if _, err := os.Stat(bogus); err == nil {
		t.Error("stale index entry survived the rebuild after a reboot")
	}
}

// TestForeignChangesCaughtUp: leases another writer creates, moves in (with an old
// mtime) or re-creates for another owner are found by their owners' DEL, and a lease
// re-created for someone else is not released by its former owner's DEL.
func TestForeignChangesCaughtUp(t *testing.T) {
	dataDir := t.TempDir()
	st := open(t, dataDir, disk.Options{})
	c := parse(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`)
	for i := 0; i < 20; i++ {
		allocate(t, st, c, own(fmt.Sprint("c", i)))
	}
	ipOf := func(o ipam.Owner) string {
		got := leasesOf(t, st, o)
		if len(got) != 1 {
			t.Fatalf("%s holds %v", o, got)
		}
		return got[0]
	}
	dir := filepath.Join(dataDir, network)
	time.Sleep(20 * time.Millisecond)
	// c3's lease is released and re-made for "thief" behind podwire's back.
	stolen := ipOf(own("c3"))
	if err := os.Remove(filepath.Join(dir, stolen)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, stolen), []byte("thief\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A lease prepared elsewhere and moved in keeps its old mtime; its ctime is new.
	moved := filepath.Join(t.TempDir(), "10.0.0.250")
	if err := os.WriteFile(moved, []byte("mover\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(moved, old, old); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(moved, filepath.Join(dir, "10.0.0.250")); err != nil {
		t.Fatal(err)
	}
	if err := ipam.Release(ctx, st, own("c3")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, stolen)); err != nil {
		t.Errorf("c3's DEL removed the lease now held by another container: %v", err)
	}
	for _, o := range []ipam.Owner{own("thief"), own("mover")} {
		if err := ipam.Release(ctx, st, o); err != nil {
			t.Fatal(err)
		}
	}
	for _, ip := range []string{stolen, "10.0.0.250"} {
		if _, err := os.Stat(filepath.Join(dir, ip)); err == nil {
			t.Errorf("lease %s made behind podwire's back was not released by its owner's DEL", ip)
		}
	}
	if got := leasesOf(t, st, own("c7")); len(got) != 1 {
		t.Errorf("an untouched lease was lost: %v", got)
	}
}

// TestCrashLeftovers covers what a crash (ours or the reference's) can leave.
func TestCrashLeftovers(t *testing.T) {
	dataDir := t.TempDir()
	now := time.Now()
	clock := func() time.Time { return now }
	st := open(t, dataDir, disk.Options{Now: clock})
	c := parse(t, `{"ranges":[[{"subnet":"10.0.0.0/29"}]]}`)
	dir := filepath.Join(dataDir, network)
	allocate(t, st, c, own("a")) // creates the directories; 10.0.0.2

	// 1. Our own crash after writing the temporary lease: it is no lease, and the
	// next call removes it.
	tmp := filepath.Join(dir, ".podwire", "lease.tmp")
	if err := os.WriteFile(tmp, []byte("dead\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	// 2. Our crash between the index write and link(2): the index names a lease
	// that does not exist.
	idxOnly := ipam.Owner{ContainerID: "ghost", IfName: "eth0"}
	if err := st.Do(ctx, func(tx ipam.Tx) error { _, err := tx.Reserve(idxOnly, net.ParseIP("10.0.0.6"), 0); return err }); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "10.0.0.6")); err != nil {
		t.Fatal(err)
	}
	// 3. The reference's crash between creating and filling a lease file: empty.
	empty := filepath.Join(dir, "10.0.0.3")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// Within the grace period the empty file still blocks its address ...
	if got := allocate(t, st, c, own("b")); !cmp.Equal(got, []string{"10.0.0.4"}) {
		t.Errorf("ADD next to a fresh empty lease got %v, want 10.0.0.4", got)
	}
	if _, err := os.Stat(tmp); err == nil {
		t.Error("leftover lease.tmp was not removed")
	}
	if got := leasesOf(t, st, idxOnly); got != nil {
		t.Errorf("index-only lease reported: %v", got)
	}
	if err := ipam.Check(ctx, st, c, idxOnly, nil); cniplumb.Code(err) != cniplumb.CodeUnknownContainer {
		t.Errorf("CHECK of index-only lease: %v", err)
	}
	// ... after it, ADD reclaims it when the walk reaches it.
	now = now.Add(disk.DefaultBrokenGrace + time.Second)
	os.Chtimes(empty, now.Add(-disk.DefaultBrokenGrace-time.Second), now.Add(-disk.DefaultBrokenGrace-time.Second))
	allocate(t, st, c, own("c")) // .5
	allocate(t, st, c, own("d")) // .6
	if got := allocate(t, st, c, own("e")); !cmp.Equal(got, []string{"10.0.0.3"}) {
		t.Errorf("ADD after the grace period got %v, want the empty lease's 10.0.0.3", got)
	}
	if b, _ := os.ReadFile(empty); string(b) != "e\r\neth0" {
		t.Errorf("reclaimed lease holds %q", b)
	}
}

// TestTornIndexEntry: an index entry emptied by a crash mid-write makes the next
// call rebuild the index, so the lease it described is still found and released.
func TestTornIndexEntry(t *testing.T) {
	dataDir := t.TempDir()
	st := open(t, dataDir, disk.Options{})
	c := parse(t, dual)
	allocate(t, st, c, own("a"))
	allocate(t, st, c, own("b"))
	owners := filepath.Join(dataDir, network, ".podwire", "owners")
	ents, _ := os.ReadDir(owners)
	for _, e := range ents {
		if err := os.WriteFile(filepath.Join(owners, e.Name()), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got := allocate(t, st, c, own("a")); !cmp.Equal(got, []string{"10.0.0.2", "fd00::2"}) {
		t.Errorf("repeated ADD with a torn index entry got %v", got)
	}
	if err := ipam.Release(ctx, st, own("b")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, network, "10.0.0.3")); !os.IsNotExist(err) {
		t.Errorf("b's lease survived DEL with a torn index entry: %v", err)
	}
}

// TestIndexDeleted: removing .podwire (as the README suggests after switching back to
// the reference) is safe: the next call rebuilds it from the lease files.
func TestIndexDeleted(t *testing.T) {
	dataDir := t.TempDir()
	st := open(t, dataDir, disk.Options{})
	c := parse(t, dual)
	allocate(t, st, c, own("a"))
	allocate(t, st, c, own("b"))
	ipam.Release(ctx, st, own("a")) // leaves spares too
	if err := os.RemoveAll(filepath.Join(dataDir, network, ".podwire")); err != nil {
		t.Fatal(err)
	}
	if got := leasesOf(t, st, own("b")); !cmp.Equal(got, []string{"10.0.0.3", "fd00::3"}) {
		t.Errorf("after deleting the index, b holds %v", got)
	}
	if err := ipam.Release(ctx, st, own("b")); err != nil {
		t.Fatal(err)
	}
	if got := allocate(t, st, c, own("c")); !cmp.Equal(got, []string{"10.0.0.4", "fd00::4"}) {
		t.Errorf("ADD after deleting the index got %v", got)
	}
}

// TestReboot: leases podwire recorded in a previous boot are reclaimable; leases it
// never saw before this boot, or whose file was re-created, are not.
func TestReboot(t *testing.T) {
	dataDir := t.TempDir()
	c := parse(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`)
	st := open(t, dataDir, disk.Options{BootID: "boot0"})
	allocate(t, st, c, own("a")) // .2
	allocate(t, st, c, own("b")) // .3
	dir := filepath.Join(dataDir, network)
	// Written by the reference before the reboot, never seen by podwire.
	if err := os.WriteFile(filepath.Join(dir, "10.0.0.50"), []byte("ref\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	// b's lease re-created by someone else (new inode, new mtime).
	time.Sleep(10 * time.Millisecond)
	os.Remove(filepath.Join(dir, "10.0.0.3"))
	if err := os.WriteFile(filepath.Join(dir, "10.0.0.3"), []byte("b\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	st = open(t, dataDir, disk.Options{BootID: "boot1"})
	prev := map[string]bool{}
	if err := st.Do(ctx, func(tx ipam.Tx) error {
		all, err := tx.All()
		for _, l := range all {
			prev[l.IP.String()] = l.PrevBoot
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if want := map[string]bool{"10.0.0.2": true, "10.0.0.3": false, "10.0.0.50": false}; !cmp.Equal(want, prev) {
		t.Errorf("prev-boot flags %v, want %v", prev, want)
	}
}

// TestConcurrent: 100 concurrent ADDs through separate Store values (separate lock
// descriptors, as separate processes have) get 100 distinct addresses; 100
// concurrent DELs leave no lease.
func TestConcurrent(t *testing.T) {
	dataDir := t.TempDir()
	c := parse(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`)
	type res struct {
		ip  []string
		err error
	}
	out := make(chan res, 100)
	for i := 0; i < 100; i++ {
		go func(i int) {
			st, _ := disk.Open(dataDir, network, disk.Options{BootID: "boot0"})
			a, err := ipam.Allocate(ctx, st, c, own("c"+string(rune('A'+i/26))+string(rune('a'+i%26))))
			var ips []string
			for _, x := range a {
				ips = append(ips, x.Address.IP.String())
			}
			out <- res{ips, err}
		}(i)
	}
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		r := <-out
		if r.err != nil || len(r.ip) != 1 {
			t.Fatalf("concurrent ADD: %v %v", r.ip, r.err)
		}
		if seen[r.ip[0]] {
			t.Fatalf("%s handed out twice", r.ip[0])
		}
		seen[r.ip[0]] = true
	}
	errs := make(chan error, 100)
	for i := 0; i < 100; i++ {
		go func(i int) {
			st, _ := disk.Open(dataDir, network, disk.Options{BootID: "boot0"})
			errs <- ipam.Release(ctx, st, own("c"+string(rune('A'+i/26))+string(rune('a'+i%26))))
		}(i)
	}
	for i := 0; i < 100; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(dataDir, network))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if d := cmp.Diff([]string{".podwire", "last_reserved_ip.0", "lock"}, names); d != "" {
		t.Errorf("after 100 DELs (-want +got):\n%s", d)
	}
	owners, _ := os.ReadDir(filepath.Join(dataDir, network, ".podwire", "owners"))
	if len(owners) != 0 {
		t.Errorf("%d index entries left", len(owners))
	}
}

func TestLockTimeout(t *testing.T) {
	dataDir := t.TempDir()
	st := open(t, dataDir, disk.Options{})
	c := parse(t, dual)
	allocate(t, st, c, own("a"))
	held := make(chan struct{})
	release := make(chan struct{})
	go st.Do(ctx, func(ipam.Tx) error { close(held); <-release; return nil })
	<-held
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := ipam.Allocate(cctx, open(t, dataDir, disk.Options{}), c, own("b"))
	close(release)
	if cniplumb.Code(err) != cniplumb.CodeTryAgain {
		t.Errorf("ADD while the lock is held past the deadline: %v, want code 11", err)
	}
	// The abandoned lock attempt does not keep the lock.
	allocate(t, open(t, dataDir, disk.Options{}), c, own("b"))
}
