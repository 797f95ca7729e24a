// SPDX-License-Identifier: Apache-2.0

package ipam_test

import (
	"context"
	"fmt"
	"math/rand"
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

// testStore is a Store plus the test hooks both implementations support.
type testStore interface {
	ipam.Store
	reboot(boot string)      // the node rebooted
	putBroken(ip string)     // an empty lease file left by a crashed writer, minutes ago
	putUnreadable(ip string) // a symlink in place of the lease file
}

type fakeStore struct{ *ipam.Fake }

func (f fakeStore) reboot(b string)         { f.Reboot(b) }
func (f fakeStore) putBroken(ip string)     { f.PutBroken(net.ParseIP(ip)) }
func (f fakeStore) putUnreadable(ip string) { f.PutUnreadable(net.ParseIP(ip)) }

// diskStore re-opens the disk store on "reboot" with another boot ID, as the next
// plugin process after a reboot would.
type diskStore struct {
	*disk.Store
	dataDir string
}

func newDiskStore(t testing.TB, boot string) *diskStore {
	d := &diskStore{dataDir: t.TempDir()}
	d.reboot(boot)
	return d
}

func (d *diskStore) reboot(boot string) {
	s, err := disk.Open(d.dataDir, "net1", disk.Options{BootID: boot})
	if err != nil {
		panic(err)
	}
	d.Store = s
}

func (d *diskStore) putBroken(ip string) {
	p := filepath.Join(d.dataDir, "net1", ip)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		panic(err)
	}
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		panic(err)
	}
	old := time.Now().Add(-time.Minute)
	if err := os.Chtimes(p, old, old); err != nil {
		panic(err)
	}
}

func (d *diskStore) putUnreadable(ip string) {
	p := filepath.Join(d.dataDir, "net1", ip)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		panic(err)
	}
	_ = os.Remove(p)
	if err := os.Symlink("/nonexistent", p); err != nil {
		panic(err)
	}
}

// eachStore runs f against the Fake and against the disk store in a temp dir: the
// allocator must behave the same on both.
func eachStore(t *testing.T, f func(t *testing.T, st testStore)) {
	t.Run("fake", func(t *testing.T) { f(t, fakeStore{ipam.NewFake()}) })
	t.Run("disk", func(t *testing.T) { f(t, newDiskStore(t, "boot0")) })
}

// dumpStore lists the leases through the Store interface itself, one per line:
// "ip container/ifname [prev-boot]", "ip broken" or "ip unreadable", then "last.N ip"
// per range set.
func dumpStore(t testing.TB, st ipam.Store, sets int) string {
	t.Helper()
	var lines []string
	err := st.Do(context.Background(), func(tx ipam.Tx) error {
		all, err := tx.All()
		if err != nil {
			return err
		}
		for _, l := range all {
			s := l.IP.String() + " " + l.Owner.ContainerID + "/" + l.Owner.IfName
			if l.PrevBoot {
				s += " prev-boot"
			}
			if l.Broken {
				s = l.IP.String() + " broken"
			}
			if l.Unreadable {
				s = l.IP.String() + " unreadable"
			}
			lines = append(lines, s)
		}
		sort.Slice(lines, func(i, j int) bool { return ipOrder(lines[i]) < ipOrder(lines[j]) })
		for i := 0; i < sets; i++ {
			last, err := tx.LastReserved(i)
			if err != nil {
				return err
			}
			lines = append(lines, fmt.Sprintf("last.%d %v", i, last))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("dumping store: %v", err)
	}
	return strings.Join(lines, "\n")
}

// ipOrder sorts v4 before v6, numerically.
func ipOrder(line string) string {
	ip := net.ParseIP(strings.Fields(line)[0])
	if v4 := ip.To4(); v4 != nil {
		return "4" + string(v4)
	}
	return "6" + string(ip)
}

func mustConf(t testing.TB, ipamJSON string, extra ...string) *ipam.Conf {
	t.Helper()
	s := `{"cniVersion":"1.1.0","name":"net1","ipam":` + ipamJSON
	for _, e := range extra {
		s += "," + e
	}
	c, err := ipam.ParseConf([]byte(s+"}"), "")
	if err != nil {
		t.Fatalf("parsing config: %v", err)
	}
	return c
}

func own(id string) ipam.Owner { return ipam.Owner{ContainerID: id, IfName: "eth0"} }

func add(t testing.TB, st ipam.Store, c *ipam.Conf, o ipam.Owner) string {
	t.Helper()
	a, err := ipam.Allocate(context.Background(), st, c, o)
	if err != nil {
		t.Fatalf("ADD %s: %v", o, err)
	}
	var out []string
	for _, x := range a {
		out = append(out, x.Address.String()+" gw "+x.Gateway.String())
	}
	return strings.Join(out, ", ")
}

func del(t testing.TB, st ipam.Store, o ipam.Owner) {
	t.Helper()
	if err := ipam.Release(context.Background(), st, o); err != nil {
		t.Fatalf("DEL %s: %v", o, err)
	}
}

// small is a /29: .1 is the gateway, .2-.6 are the five usable addresses.
const small = `{"ranges":[[{"subnet":"10.0.0.0/29"}]]}`

func TestRoundRobin(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		c := mustConf(t, small)
		var got []string
		for _, id := range []string{"a", "b", "c"} {
			got = append(got, add(t, st, c, own(id)))
		}
		del(t, st, own("b"))
		// The released .3 is not reused until the range wraps around.
		for _, id := range []string{"d", "e", "f"} {
			got = append(got, add(t, st, c, own(id)))
		}
		want := []string{"10.0.0.2/29 gw 10.0.0.1", "10.0.0.3/29 gw 10.0.0.1", "10.0.0.4/29 gw 10.0.0.1",
			"10.0.0.5/29 gw 10.0.0.1", "10.0.0.6/29 gw 10.0.0.1", "10.0.0.3/29 gw 10.0.0.1"}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("allocation order (-want +got):\n%s", d)
		}
		if d := cmp.Diff(`10.0.0.2 a/eth0
10.0.0.3 f/eth0
10.0.0.4 c/eth0
10.0.0.5 d/eth0
10.0.0.6 e/eth0
last.0 10.0.0.3`, dumpStore(t, st, 1)); d != "" {
			t.Errorf("store (-want +got):\n%s", d)
		}
	})
}

func TestRoundRobinAcrossRanges(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		// Two ranges in one set; the gateway .1 is inside the first and skipped.
		c := mustConf(t, `{"ranges":[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.1","rangeEnd":"10.0.0.2"},{"subnet":"10.0.1.0/24","rangeStart":"10.0.1.7","rangeEnd":"10.0.1.8"}]]}`)
		var got []string
		for _, id := range []string{"a", "b", "c"} {
			got = append(got, add(t, st, c, own(id)))
		}
		del(t, st, own("a"))
		got = append(got, add(t, st, c, own("d")))
		want := []string{"10.0.0.2/24 gw 10.0.0.1", "10.0.1.7/24 gw 10.0.1.1", "10.0.1.8/24 gw 10.0.1.1", "10.0.0.2/24 gw 10.0.0.1"}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("(-want +got):\n%s", d)
		}
	})
}

func TestExhaustion(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		c := mustConf(t, small)
		for i := 0; i < 5; i++ {
			add(t, st, c, own(fmt.Sprint("c", i)))
		}
		before := dumpStore(t, st, 1)
		_, err := ipam.Allocate(context.Background(), st, c, own("extra"))
		if cniplumb.Code(err) != cniplumb.CodeNotAvailable || !strings.Contains(err.Error(), "all 5 usable addresses are leased") {
			t.Fatalf("ADD on a full range: %v (code %d), want code 50 naming the 5 addresses", err, cniplumb.Code(err))
		}
		if err := ipam.Status(context.Background(), st, c); cniplumb.Code(err) != cniplumb.CodeNotAvailable || !strings.Contains(err.Error(), "exhausted") {
			t.Errorf("STATUS on a full range: %v", err)
		}
		if d := cmp.Diff(before, dumpStore(t, st, 1)); d != "" {
			t.Errorf("a failed ADD changed the store:\n%s", d)
		}
		del(t, st, own("c3"))
		if err := ipam.Status(context.Background(), st, c); err != nil {
			t.Errorf("STATUS with a free address: %v", err)
		}
		if got := add(t, st, c, own("extra")); got != "10.0.0.5/29 gw 10.0.0.1" {
			t.Errorf("ADD after a DEL got %s", got)
		}
	})
}

func TestIdempotentAdd(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		c := mustConf(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]}`)
		first := add(t, st, c, own("a"))
		add(t, st, c, own("b"))
		again := add(t, st, c, own("a"))
		if first != again {
			t.Errorf("repeated ADD got %s, first ADD got %s", again, first)
		}
		// Another interface of the same container is another attachment.
		if eth1 := add(t, st, c, ipam.Owner{ContainerID: "a", IfName: "eth1"}); eth1 == first {
			t.Errorf("eth1 got eth0's addresses %s", eth1)
		}
		if d := cmp.Diff(`10.0.0.2 a/eth0
10.0.0.3 b/eth0
10.0.0.4 a/eth1
fd00::2 a/eth0
fd00::3 b/eth0
fd00::4 a/eth1
last.0 10.0.0.4
last.1 fd00::4`, dumpStore(t, st, 2)); d != "" {
			t.Errorf("store (-want +got):\n%s", d)
		}
		// An ADD that finds its lease in only one set completes the other.
		del(t, st, own("a"))
		set0 := mustConf(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`)
		add(t, st, set0, own("a"))
		if got := add(t, st, c, own("a")); got != "10.0.0.5/24 gw 10.0.0.1, fd00::5/64 gw fd00::1" {
			t.Errorf("completing ADD got %s", got)
		}
	})
}

// TestRepeatedAddOfLegacyLease: an attachment whose address in one range set is a
// legacy lease (container ID only, from a reference host-local before v0.8) gets the
// other set completed by its first ADD; a repeated ADD must return the same two
// addresses and allocate nothing, and the legacy lease is now the attachment's (so
// its DEL releases both, and another interface of the container does not get it).
func TestRepeatedAddOfLegacyLease(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		v4 := mustConf(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`)
		dual := mustConf(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]}`)
		if _, err := ipam.Allocate(context.Background(), st, v4, ipam.Owner{ContainerID: "a"}); err != nil {
			t.Fatal(err)
		}
		first := add(t, st, dual, own("a"))
		if first != "10.0.0.2/24 gw 10.0.0.1, fd00::2/64 gw fd00::1" {
			t.Errorf("ADD completing a legacy lease got %s", first)
		}
		if again := add(t, st, dual, own("a")); again != first {
			t.Errorf("repeated ADD got %s, the first %s", again, first)
		}
		if d := cmp.Diff("10.0.0.2 a/eth0\nfd00::2 a/eth0\nlast.0 10.0.0.2\nlast.1 fd00::2", dumpStore(t, st, 2)); d != "" {
			t.Errorf("store after the repeated ADD (-want +got):\n%s", d)
		}
		if eth1 := add(t, st, dual, ipam.Owner{ContainerID: "a", IfName: "eth1"}); eth1 != "10.0.0.3/24 gw 10.0.0.1, fd00::3/64 gw fd00::1" {
			t.Errorf("another interface of the container got %s", eth1)
		}
		del(t, st, own("a"))
		if d := cmp.Diff("10.0.0.3 a/eth1\nfd00::3 a/eth1\nlast.0 10.0.0.3\nlast.1 fd00::3", dumpStore(t, st, 2)); d != "" {
			t.Errorf("store after DEL (-want +got):\n%s", d)
		}
	})
}

// TestRepeatedAddFailureKeepsLease: a repeated ADD that fails (the requested address
// differs from the one held, a range set with no free address, a write error) leaves
// the leases the attachment already held exactly as they were.
func TestRepeatedAddFailureKeepsLease(t *testing.T) {
	full := `{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64","rangeStart":"fd00::9","rangeEnd":"fd00::9"}]]}`
	for _, tc := range []struct {
		name  string
		again *ipam.Conf
		fail  string // armed Fake failure
	}{
		{name: "another requested address", again: mustConf(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`, `"args":{"cni":{"ips":["10.0.0.9"]}}`)},
		{name: "exhausted set to complete", again: mustConf(t, full)},
		{name: "write error completing a set", again: mustConf(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]}`), fail: "write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := ipam.NewFake()
			v4 := mustConf(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`)
			add(t, f, v4, own("a"))
			add(t, f, mustConf(t, full), own("b")) // takes fd00::9
			before := f.Dump()
			if tc.fail != "" {
				f.FailNext(tc.fail)
			}
			if _, err := ipam.Allocate(context.Background(), f, tc.again, own("a")); err == nil {
				t.Fatal("repeated ADD succeeded")
			}
			if d := cmp.Diff(before, f.Dump()); d != "" {
				t.Errorf("a failed repeated ADD changed the store (-before +after):\n%s", d)
			}
		})
	}
}

// TestUnreadableLease: a lease file replaced by something else (a symlink) keeps its
// address taken; its attachment still holds it (CHECK passes, a repeated ADD returns
// it and writes the lease again, DEL releases it); GC keeps it for a valid attachment
// and releases one nobody holds.
func TestUnreadableLease(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		c := mustConf(t, small)
		add(t, st, c, own("a")) // .2
		add(t, st, c, own("b")) // .3
		st.putUnreadable("10.0.0.2")
		st.putUnreadable("10.0.0.4") // nobody's
		if got := add(t, st, c, own("c")); got != "10.0.0.5/29 gw 10.0.0.1" {
			t.Errorf("ADD next to unreadable leases got %s", got)
		}
		if err := ipam.Check(context.Background(), st, c, own("a"), nil); err != nil {
			t.Errorf("CHECK of a: %v", err)
		}
		if err := ipam.GC(context.Background(), st, []ipam.Owner{own("a"), own("b"), own("c")}); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff("10.0.0.2 unreadable\n10.0.0.3 b/eth0\n10.0.0.5 c/eth0\nlast.0 10.0.0.5", dumpStore(t, st, 1)); d != "" {
			t.Errorf("after GC (-want +got):\n%s", d)
		}
		if got := add(t, st, c, own("a")); got != "10.0.0.2/29 gw 10.0.0.1" {
			t.Errorf("repeated ADD of a got %s", got)
		}
		if d := cmp.Diff("10.0.0.2 a/eth0\n10.0.0.3 b/eth0\n10.0.0.5 c/eth0\nlast.0 10.0.0.5", dumpStore(t, st, 1)); d != "" {
			t.Errorf("after the repeated ADD (-want +got):\n%s", d)
		}
		st.putUnreadable("10.0.0.3")
		del(t, st, own("b"))
		if d := cmp.Diff("10.0.0.2 a/eth0\n10.0.0.5 c/eth0\nlast.0 10.0.0.5", dumpStore(t, st, 1)); d != "" {
			t.Errorf("after DEL of b (-want +got):\n%s", d)
		}
	})
}

func TestDualStack(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		c := mustConf(t, `{"ranges":[[{"subnet":"10.1.0.0/16","gateway":"10.1.255.254"}],[{"subnet":"fd00:1::/64","rangeStart":"fd00:1::100"}]]}`)
		if got := add(t, st, c, own("a")); got != "10.1.0.1/16 gw 10.1.255.254, fd00:1::100/64 gw fd00:1::1" {
			t.Errorf("dual-stack ADD got %s", got)
		}
		del(t, st, own("a"))
		del(t, st, own("a")) // DEL repeats
		if d := cmp.Diff("last.0 10.1.0.1\nlast.1 fd00:1::100", dumpStore(t, st, 2)); d != "" {
			t.Errorf("after DEL (-want +got):\n%s", d)
		}
	})
}

// TestAddRollback: when the second range set is full, the address taken from the
// first is released again.
func TestAddRollback(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		c := mustConf(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64","rangeStart":"fd00::9","rangeEnd":"fd00::9"}]]}`)
		add(t, st, c, own("a"))
		before := dumpStore(t, st, 2)
		_, err := ipam.Allocate(context.Background(), st, c, own("b"))
		if cniplumb.Code(err) != cniplumb.CodeNotAvailable {
			t.Fatalf("ADD with the v6 set full: %v", err)
		}
		after := dumpStore(t, st, 2)
		// last_reserved_ip.0 moved (the reference's behaviour too); the lease did not stay.
		want := strings.Replace(before, "last.0 10.0.0.2", "last.0 10.0.0.3", 1)
		if d := cmp.Diff(want, after); d != "" {
			t.Errorf("store after failed ADD (-want +got):\n%s", d)
		}
	})
}

func TestRequestedIP(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		base := `{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]}`
		req := func(ips string) *ipam.Conf { return mustConf(t, base, `"runtimeConfig":{"ips":[`+ips+`]}`) }
		if got := add(t, st, req(`"10.0.0.50","fd00::50"`), own("a")); got != "10.0.0.50/24 gw 10.0.0.1, fd00::50/64 gw fd00::1" {
			t.Errorf("requested both got %s", got)
		}
		// Only v4 requested: v6 comes round-robin, after the last reserved fd00::50.
		if got := add(t, st, req(`"10.0.0.9"`), own("b")); got != "10.0.0.9/24 gw 10.0.0.1, fd00::51/64 gw fd00::1" {
			t.Errorf("requested v4 only got %s", got)
		}
		// Taken by another container: a clear error naming the holder, nothing kept.
		before := dumpStore(t, st, 2)
		_, err := ipam.Allocate(context.Background(), st, req(`"10.0.0.77","fd00::50"`), own("c"))
		if cniplumb.Code(err) != cniplumb.CodeInvalidConfig || !strings.Contains(err.Error(), "fd00::50 is already leased to a/eth0") {
			t.Errorf("requesting a taken address: %v", err)
		}
		want := strings.Replace(before, "last.0 10.0.0.9", "last.0 10.0.0.77", 1)
		if d := cmp.Diff(want, dumpStore(t, st, 2)); d != "" {
			t.Errorf("failed ADD left (-want +got):\n%s", d)
		}
		// The holder repeating its ADD with the same request gets its lease back ...
		if got := add(t, st, req(`"10.0.0.50"`), own("a")); got != "10.0.0.50/24 gw 10.0.0.1, fd00::50/64 gw fd00::1" {
			t.Errorf("repeated ADD got %s", got)
		}
		// ... and asking for another address while holding one is refused.
		if _, err := ipam.Allocate(context.Background(), st, req(`"10.0.0.51"`), own("a")); err == nil || !strings.Contains(err.Error(), "already holds 10.0.0.50") {
			t.Errorf("re-requesting a different address: %v", err)
		}
	})
}

func TestRebootReclaim(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		c := mustConf(t, small)
		for _, id := range []string{"a", "b", "c", "d", "e"} {
			add(t, st, c, own(id))
		}
		st.reboot("boot1")
		// A container re-added after the reboot keeps its address and is current again.
		if got := add(t, st, c, own("b")); got != "10.0.0.3/29 gw 10.0.0.1" {
			t.Errorf("re-ADD after reboot got %s", got)
		}
		if err := ipam.Status(context.Background(), st, c); err != nil {
			t.Errorf("STATUS with reclaimable leases: %v", err)
		}
		// The range is full, so the previous boot's leases are reclaimed: all of them
		// in this set, at once; b's renewed lease survives.
		if got := add(t, st, c, own("new")); got != "10.0.0.2/29 gw 10.0.0.1" {
			t.Errorf("ADD on a range full of last boot's leases got %s", got)
		}
		if d := cmp.Diff(`10.0.0.2 new/eth0
10.0.0.3 b/eth0
last.0 10.0.0.2`, dumpStore(t, st, 1)); d != "" {
			t.Errorf("after reclaim (-want +got):\n%s", d)
		}
	})
}

func TestRebootNotReclaimedUntilExhausted(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		c := mustConf(t, small)
		add(t, st, c, own("a"))
		st.reboot("boot1")
		add(t, st, c, own("b"))
		if d := cmp.Diff(`10.0.0.2 a/eth0 prev-boot
10.0.0.3 b/eth0
last.0 10.0.0.3`, dumpStore(t, st, 1)); d != "" {
			t.Errorf("(-want +got):\n%s", d)
		}
		// A requested address held by a lease from the previous boot is taken over.
		rc := mustConf(t, small, `"runtimeConfig":{"ips":["10.0.0.2"]}`)
		if got := add(t, st, rc, own("c")); got != "10.0.0.2/29 gw 10.0.0.1" {
			t.Errorf("requesting last boot's address got %s", got)
		}
		// But not one held in this boot.
		if _, err := ipam.Allocate(context.Background(), st, mustConf(t, small, `"runtimeConfig":{"ips":["10.0.0.3"]}`), own("d")); err == nil {
			t.Error("requesting a current lease succeeded")
		}
	})
}

func TestBrokenLease(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		c := mustConf(t, small)
		st.putBroken("10.0.0.2")
		if got := add(t, st, c, own("a")); got != "10.0.0.2/29 gw 10.0.0.1" {
			t.Errorf("ADD over an empty stale lease got %s", got)
		}
		st.putBroken("10.0.0.6")
		if err := ipam.GC(context.Background(), st, []ipam.Owner{own("a")}); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff("10.0.0.2 a/eth0\nlast.0 10.0.0.2", dumpStore(t, st, 1)); d != "" {
			t.Errorf("GC left (-want +got):\n%s", d)
		}
	})
}

func TestGC(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		c := mustConf(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]}`)
		for _, o := range []ipam.Owner{own("a"), {ContainerID: "a", IfName: "eth1"}, own("b"), own("c")} {
			add(t, st, c, o)
		}
		if err := ipam.GC(context.Background(), st, []ipam.Owner{own("a"), own("c"), own("zzz")}); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(`10.0.0.2 a/eth0
10.0.0.5 c/eth0
fd00::2 a/eth0
fd00::5 c/eth0
last.0 10.0.0.5
last.1 fd00::5`, dumpStore(t, st, 2)); d != "" {
			t.Errorf("after GC (-want +got):\n%s", d)
		}
		if err := ipam.GC(context.Background(), st, nil); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff("last.0 10.0.0.5\nlast.1 fd00::5", dumpStore(t, st, 2)); d != "" {
			t.Errorf("GC with no valid attachments left (-want +got):\n%s", d)
		}
	})
}

func TestCheck(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		c := mustConf(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]}`)
		ctx := context.Background()
		if err := ipam.Check(ctx, st, c, own("a"), nil); cniplumb.Code(err) != cniplumb.CodeUnknownContainer {
			t.Errorf("CHECK without lease: %v", err)
		}
		add(t, st, c, own("a"))
		ips := func(s ...string) []net.IP {
			var out []net.IP
			for _, x := range s {
				out = append(out, net.ParseIP(x))
			}
			return out
		}
		for _, tc := range []struct {
			name string
			prev []net.IP
			want string
		}{
			{"no prevResult", nil, ""},
			{"matching", ips("10.0.0.2", "fd00::2"), ""},
			{"matching plus an address of another IPAM", ips("10.0.0.2", "fd00::2", "192.168.1.1"), ""},
			{"v6 missing", ips("10.0.0.2"), "leased fd00::2 is missing from prevResult"},
			{"wrong v4", ips("10.0.0.3", "fd00::2"), "prevResult's 10.0.0.3 is not leased to it"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				prev := tc.prev
				if prev == nil && tc.name != "no prevResult" {
					prev = []net.IP{}
				}
				err := ipam.Check(ctx, st, c, own("a"), prev)
				if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
					t.Errorf("CHECK: %v, want %q", err, tc.want)
				}
			})
		}
		// A lease in only one of the two sets fails CHECK.
		del(t, st, own("a"))
		add(t, st, mustConf(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`), own("a"))
		if err := ipam.Check(ctx, st, c, own("a"), nil); cniplumb.Code(err) != cniplumb.CodeUnknownContainer || !strings.Contains(err.Error(), "range set 1") {
			t.Errorf("CHECK with the v6 lease missing: %v", err)
		}
	})
}

func TestFakeWriteFailure(t *testing.T) {
	f := ipam.NewFake()
	c := mustConf(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]}`)
	add(t, f, c, own("a"))
	before := f.Dump()
	f.FailNext("write")
	if err := ipam.Status(context.Background(), f, c); cniplumb.Code(err) != cniplumb.CodeNotAvailable {
		t.Errorf("STATUS with an unwritable store: %v", err)
	}
	if _, err := ipam.Allocate(context.Background(), f, c, own("b")); err == nil {
		t.Fatal("ADD on a full disk succeeded")
	}
	if d := cmp.Diff(before, f.Dump()); d != "" {
		t.Errorf("failed ADD changed the store:\n%s", d)
	}
}

// TestStateWalk runs ADD, DEL, CHECK and GC for a few attachments in random order,
// checking after every step that no address is leased twice and every attachment
// that was ADDed (and not removed) holds one address per set; at the end DEL of
// everything must leave an empty store.
func TestStateWalk(t *testing.T) {
	eachStore(t, func(t *testing.T, st testStore) {
		c := mustConf(t, `{"ranges":[[{"subnet":"10.0.0.0/28"}],[{"subnet":"fd00::/124"}]]}`)
		ctx := context.Background()
		owners := []ipam.Owner{own("a"), own("b"), own("c"), {ContainerID: "c", IfName: "net1"}, own("d")}
		live := map[ipam.Owner]bool{}
		seed := time.Now().UnixNano()
		rng := rand.New(rand.NewSource(seed))
		for step := 0; step < 300; step++ {
			o := owners[rng.Intn(len(owners))]
			switch op := rng.Intn(10); {
			case op < 4:
				add(t, st, c, o)
				live[o] = true
			case op < 7:
				del(t, st, o)
				delete(live, o)
			case op < 9:
				err := ipam.Check(ctx, st, c, o, nil)
				if live[o] != (err == nil) {
					t.Fatalf("seed %d step %d: CHECK %s = %v, live=%v", seed, step, o, err, live[o])
				}
			default:
				var valid []ipam.Owner
				for v := range live {
					if rng.Intn(3) > 0 {
						valid = append(valid, v)
					} else {
						delete(live, v)
					}
				}
				if err := ipam.GC(ctx, st, valid); err != nil {
					t.Fatal(err)
				}
			}
			if step%37 == 0 {
				st.reboot(fmt.Sprint("boot", step))
			}
			seen := map[string]ipam.Owner{}
			count := map[ipam.Owner]int{}
			_ = st.Do(ctx, func(tx ipam.Tx) error {
				all, err := tx.All()
				if err != nil {
					t.Fatal(err)
				}
				for _, l := range all {
					if prev, dup := seen[l.IP.String()]; dup {
						t.Fatalf("seed %d step %d: %s leased to %s and %s", seed, step, l.IP, prev, l.Owner)
					}
					seen[l.IP.String()] = l.Owner
					count[l.Owner]++
				}
				return nil
			})
			for o := range live {
				if count[o] != 2 {
					t.Fatalf("seed %d step %d: %s holds %d addresses, want 2", seed, step, o, count[o])
				}
			}
			if len(count) != len(live) {
				t.Fatalf("seed %d step %d: leases of %v, live %v", seed, step, count, live)
			}
		}
		for _, o := range owners {
			del(t, st, o)
		}
		if dump := dumpStore(t, st, 0); dump != "" {
			t.Fatalf("seed %d: store not empty after DEL of everything:\n%s", seed, dump)
		}
	})
}
