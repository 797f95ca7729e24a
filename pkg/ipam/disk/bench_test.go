// SPDX-License-Identifier: Apache-2.0

package disk_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/podwire/podwire/pkg/ipam"
	"github.com/podwire/podwire/pkg/ipam/disk"
)

// benchConf is a /16, as in the 10,000-lease measurement.
const benchConf = `{"ranges":[[{"subnet":"10.88.0.0/16"}]]}`

// preload writes n leases the way the reference would have left them (one file each,
// last_reserved_ip.0 after the last) and lets one call index them, so the timed
// calls start from a warm, fresh index.
func preload(b *testing.B, n int) (*disk.Store, *ipam.Conf) {
	b.Helper()
	dataDir := b.TempDir()
	if benchOnTmpfs {
		d, err := os.MkdirTemp("/dev/shm", "podwire-bench-")
		if err != nil {
			b.Skipf("no /dev/shm: %v", err)
		}
		b.Cleanup(func() { os.RemoveAll(d) })
		dataDir = d
	}
	dir := filepath.Join(dataDir, network)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	var last net.IP
	for i := 0; i < n; i++ {
		last = net.IPv4(10, 88, byte((i+2)>>8), byte(i+2)).To4()
		if err := os.WriteFile(filepath.Join(dir, last.String()), []byte(fmt.Sprintf("pre%05d\r\neth0", i)), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	if last != nil {
		if err := os.WriteFile(filepath.Join(dir, "last_reserved_ip.0"), []byte(last.String()), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	st := open(b, dataDir, disk.Options{})
	c := parse(b, benchConf)
	allocate(b, st, c, own("warmup"))
	return st, c
}

// benchOnTmpfs moves the benchmarks' stores to /dev/shm (PODWIRE_BENCH_TMPFS=1): a
// tmpfs has no journal or device latency, so what remains is the algorithm's cost,
// which makes a dependence on the number of leases easy to see on a noisy machine.
var benchOnTmpfs = os.Getenv("PODWIRE_BENCH_TMPFS") != ""

// BenchmarkAdd is one ADD (a new attachment) on a store that already holds 0 or
// 10,000 leases.
func BenchmarkAdd(b *testing.B) {
	for _, n := range []int{0, 10000} {
		b.Run(fmt.Sprintf("leases=%d", n), func(b *testing.B) {
			st, c := preload(b, n)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := ipam.Allocate(ctx, st, c, own(fmt.Sprint("bench", i))); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDel is one DEL of an existing attachment on a store that holds 0 or
// 10,000 other leases.
func BenchmarkDel(b *testing.B) {
	for _, n := range []int{0, 10000} {
		b.Run(fmt.Sprintf("leases=%d", n), func(b *testing.B) {
			st, c := preload(b, n)
			for i := 0; i < b.N; i++ {
				allocate(b, st, c, own(fmt.Sprint("bench", i)))
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := ipam.Release(ctx, st, own(fmt.Sprint("bench", i))); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReference measures the same ADD and DEL with the reference host-local's
// own disk backend (its GetByID and ReleaseByID read every lease file), for the
// comparison in docs/performance.md. The allocation loop around it mirrors the reference
// allocator's Get: refuse a duplicate, then Reserve round-robin from the last address.
// At 10,000 leases one call takes about half a second, so it runs only with
// PODWIRE_BENCH_REFERENCE=1, and briefly: -bench Reference -benchtime=10x.
func BenchmarkReference(b *testing.B) {
	if os.Getenv("PODWIRE_BENCH_REFERENCE") == "" {
		b.Skip("set PODWIRE_BENCH_REFERENCE=1 to measure the reference backend (slow)")
	}
	for _, n := range []int{0, 10000} {
		for _, op := range []string{"add", "del"} {
			b.Run(fmt.Sprintf("%s/leases=%d", op, n), func(b *testing.B) {
				st, c := preload(b, n)
				ref := refStore(b, filepath.Dir(st.Dir()))
				set := c.RangeSets[0]
				refAdd := func(id string) {
					ref.Lock()
					defer ref.Unlock()
					if len(ref.GetByID(id, "eth0")) > 0 {
						b.Fatalf("duplicate %s", id)
					}
					last, _ := ref.LastReservedIP("0")
					it := ipam.NewIter(set, last)
					for ip, _ := it.Next(); ip != nil; ip, _ = it.Next() {
						if ok, err := ref.Reserve(id, "eth0", ip, "0"); err != nil {
							b.Fatal(err)
						} else if ok {
							return
						}
					}
					b.Fatal("range full")
				}
				if op == "add" {
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						refAdd(fmt.Sprint("ref", i))
					}
					return
				}
				for i := 0; i < b.N; i++ {
					refAdd(fmt.Sprint("ref", i))
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					ref.Lock()
					if err := ref.ReleaseByID(fmt.Sprint("ref", i), "eth0"); err != nil {
						b.Fatal(err)
					}
					ref.Unlock()
				}
			})
		}
	}
}
