// SPDX-License-Identifier: Apache-2.0

package disk_test

// These tests prove file compatibility with the reference host-local by driving its
// own backend packages (containernetworking/plugins v1.10.0) against the same
// directory as podwire's store. They are imported here, in tests only.

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	refdisk "github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"
	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/ipam"
	"github.com/podwire/podwire/pkg/ipam/disk"
)

func refStore(t testing.TB, dataDir string) *refdisk.Store {
	t.Helper()
	s, err := refdisk.New(network, dataDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// refAllocate does what the reference allocator's Get does, through the reference
// disk backend's own methods and lock: refuse a duplicate, then try addresses of the
// /24 round-robin from last_reserved_ip.0 with its Reserve (O_EXCL). (The reference
// allocator package itself needs modules podwire does not depend on; the integration
// tests run the real reference binary.)
func refAllocate(t testing.TB, s *refdisk.Store, subnet, id, ifname string, requested net.IP) (net.IP, error) {
	_, n, err := net.ParseCIDR(subnet)
	if err != nil {
		t.Fatal(err)
	}
	s.Lock()
	defer s.Unlock()
	if got := s.GetByID(id, ifname); len(got) > 0 {
		return nil, fmt.Errorf("%s has been allocated to %s, duplicate allocation is not allowed", got[0], id)
	}
	base := n.IP.To4()
	start := 2
	if last, err := s.LastReservedIP("0"); err == nil && n.Contains(last) {
		start = int(last.To4()[3]) + 1
	}
	for k := 0; k < 253; k++ {
		host := 2 + (start-2+k)%253 // .2 to .254; .1 is the gateway
		ip := net.IPv4(base[0], base[1], base[2], byte(host)).To4()
		ok, err := s.Reserve(id, ifname, ip, "0")
		if err != nil {
			return nil, err
		}
		if ok {
			return ip, nil
		}
	}
	return nil, fmt.Errorf("no IP addresses available")
}

func refIPs(s *refdisk.Store, id, ifname string) []string {
	var out []string
	for _, ip := range s.GetByID(id, ifname) {
		out = append(out, ip.String())
	}
	sort.Strings(out)
	return out
}

// TestReferenceToPodwire: leases the reference wrote are honoured and released by
// podwire.
func TestReferenceToPodwire(t *testing.T) {
	dataDir := t.TempDir()
	ref := refStore(t, dataDir)
	for _, id := range []string{"r1", "r2", "r3"} {
		if _, err := refAllocate(t, ref, "10.0.0.0/24", id, "eth0", nil); err != nil {
			t.Fatal(err)
		}
	}
	// A legacy lease (container ID only), as reference versions before 0.8 wrote.
	if err := os.WriteFile(filepath.Join(dataDir, network, "10.0.0.100"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}

	st := open(t, dataDir, disk.Options{})
	c := parse(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`)
	if got := leasesOf(t, st, own("r2")); !cmp.Equal(got, []string{"10.0.0.3"}) {
		t.Errorf("podwire sees r2's lease as %v", got)
	}
	// ADD for a reference-made attachment returns its lease (no duplicate).
	if got := allocate(t, st, c, own("r1")); !cmp.Equal(got, []string{"10.0.0.2"}) {
		t.Errorf("ADD r1 got %v", got)
	}
	// New leases continue the reference's round-robin and skip its leases.
	if got := allocate(t, st, c, own("p1")); !cmp.Equal(got, []string{"10.0.0.5"}) {
		t.Errorf("ADD p1 got %v", got)
	}
	// The legacy lease belongs to container "old" on any interface.
	if got := leasesOf(t, st, ipam.Owner{ContainerID: "old", IfName: "eth3"}); !cmp.Equal(got, []string{"10.0.0.100"}) {
		t.Errorf("legacy lease seen as %v", got)
	}
	for _, o := range []ipam.Owner{own("r2"), {ContainerID: "old", IfName: "eth0"}} {
		if err := ipam.Release(ctx, st, o); err != nil {
			t.Fatal(err)
		}
	}
	if got := refIPs(ref, "r2", "eth0"); got != nil {
		t.Errorf("reference still sees r2's lease %v after podwire's DEL", got)
	}
	if ref.FindByID("old", "eth0") {
		t.Error("legacy lease survived podwire's DEL")
	}
	if got := refIPs(ref, "p1", "eth0"); !cmp.Equal(got, []string{"10.0.0.5"}) {
		t.Errorf("reference sees p1's lease as %v", got)
	}
}

// TestPodwireToReference: leases podwire wrote are honoured and released by the
// reference, and podwire notices what the reference did.
func TestPodwireToReference(t *testing.T) {
	dataDir := t.TempDir()
	st := open(t, dataDir, disk.Options{})
	c := parse(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]}`)
	allocate(t, st, c, own("p1")) // 10.0.0.2, fd00::2
	allocate(t, st, c, own("p2")) // 10.0.0.3, fd00::3
	allocate(t, st, c, own("p3")) // 10.0.0.4, fd00::4

	ref := refStore(t, dataDir)
	if got := refIPs(ref, "p1", "eth0"); !cmp.Equal(got, []string{"10.0.0.2", "fd00::2"}) {
		t.Errorf("reference sees p1's leases as %v", got)
	}
	if !ref.FindByID("p2", "eth0") {
		t.Error("reference CHECK does not find p2")
	}
	if last, err := ref.LastReservedIP("1"); err != nil || last.String() != "fd00::4" {
		t.Errorf("reference reads last_reserved_ip.1 as %v, %v", last, err)
	}
	// The reference refuses a duplicate ADD for a podwire attachment, so it sees it.
	if _, err := refAllocate(t, ref, "10.0.0.0/24", "p3", "eth0", nil); err == nil {
		t.Error("reference allocated a second address to p3")
	}
	// The reference allocates around podwire's leases, continuing its round-robin.
	ip, err := refAllocate(t, ref, "10.0.0.0/24", "r1", "eth0", nil)
	if err != nil || ip.String() != "10.0.0.5" {
		t.Errorf("reference ADD got %v, %v", ip, err)
	}
	// The reference releases podwire's leases ...
	ref.Lock()
	if err := ref.ReleaseByID("p1", "eth0"); err != nil {
		t.Fatal(err)
	}
	ref.Unlock()
	// ... and its GC keeps podwire's index directory and valid leases.
	if err := ref.GC([]types.GCAttachment{{ContainerID: "p3", IfName: "eth0"}, {ContainerID: "r1", IfName: "eth0"}}); err != nil {
		t.Fatal(err)
	}

	// podwire picks all of it up.
	if got := leasesOf(t, st, own("p1")); got != nil {
		t.Errorf("podwire still sees p1's released leases %v", got)
	}
	if got := leasesOf(t, st, own("p2")); got != nil {
		t.Errorf("podwire still sees p2's collected leases %v", got)
	}
	if got := leasesOf(t, st, own("r1")); !cmp.Equal(got, []string{"10.0.0.5"}) {
		t.Errorf("podwire sees r1 as %v", got)
	}
	if err := ipam.Check(ctx, st, c, own("p3"), nil); err != nil {
		t.Errorf("CHECK p3 after the reference's GC: %v", err)
	}
	// And p1's ADD after the reference released it is a fresh one, round-robin after
	// the reference's 10.0.0.5.
	if got := allocate(t, st, c, own("p1")); !cmp.Equal(got, []string{"10.0.0.6", "fd00::5"}) {
		t.Errorf("ADD p1 again got %v", got)
	}
	if err := ipam.Release(ctx, st, own("r1")); err != nil {
		t.Fatal(err)
	}
	if ref.FindByID("r1", "eth0") {
		t.Error("reference still finds r1 after podwire's DEL")
	}
}

// TestMixedConcurrent: the reference's allocator and podwire's, running at once on
// one network, exclude each other through the shared flock: 100 distinct addresses.
func TestMixedConcurrent(t *testing.T) {
	dataDir := t.TempDir()
	refStore(t, dataDir) // creates the directory and lock as the reference does
	c := parse(t, `{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`)
	var mu sync.Mutex
	got := map[string]string{}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := fmt.Sprintf("c%03d", i)
			var ip string
			if i%2 == 0 {
				s, err := refdisk.New(network, dataDir)
				if err != nil {
					errs <- err
					return
				}
				defer s.Close()
				a, err := refAllocate(t, s, "10.0.0.0/24", id, "eth0", nil)
				if err != nil {
					errs <- fmt.Errorf("reference ADD %s: %w", id, err)
					return
				}
				ip = a.String()
			} else {
				st, _ := disk.Open(dataDir, network, disk.Options{BootID: "boot0"})
				a, err := ipam.Allocate(ctx, st, c, own(id))
				if err != nil {
					errs <- fmt.Errorf("podwire ADD %s: %w", id, err)
					return
				}
				ip = a[0].Address.IP.String()
			}
			mu.Lock()
			defer mu.Unlock()
			if other, dup := got[ip]; dup {
				errs <- fmt.Errorf("%s given to %s and %s", ip, other, id)
			}
			got[ip] = id
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(got) != 100 {
		t.Errorf("%d distinct addresses, want 100", len(got))
	}
	// Each side sees every lease of the other.
	st := open(t, dataDir, disk.Options{})
	ref := refStore(t, dataDir)
	for ip, id := range got {
		if l := leasesOf(t, st, own(id)); !cmp.Equal(l, []string{ip}) {
			t.Errorf("podwire sees %s as %v, want %s", id, l, ip)
		}
		if l := refIPs(ref, id, "eth0"); !cmp.Equal(l, []string{ip}) {
			t.Errorf("reference sees %s as %v, want %s", id, l, ip)
		}
	}
}
