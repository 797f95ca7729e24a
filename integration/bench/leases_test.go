// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// leaseSubnet is the /16 the lease benchmarks allocate from.
const leaseSubnet = "10.89.0.0/16"

// leaseConf is host-local alone with its own data dir per runner (@LEASEDIR@).
const leaseConf = `{"cniVersion":"1.1.0","name":"@NAME@","plugins":[
	{"type":"host-local","ipam":{"type":"host-local","ranges":[[{"subnet":"` + leaseSubnet + `"}]],"dataDir":"@LEASEDIR@"}}]}`

// writeLeases fills dir (host-local's <dataDir>/<network>) with n leases exactly as the
// reference's disk backend writes them: a file per address named by the address,
// mode 0600, holding "<containerID>\r\n<ifname>", and last_reserved_ip.0 naming the
// last one. Addresses run up from 10.89.0.2 (.0 is the network, .1 the gateway).
func writeLeases(dir string, n int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	base := binary.BigEndian.Uint32(net.ParseIP("10.89.0.2").To4())
	var last net.IP
	for i := 0; i < n; i++ {
		ip := make(net.IP, 4)
		binary.BigEndian.PutUint32(ip, base+uint32(i))
		id := fmt.Sprintf("%064x", uint64(i)*0x9E3779B97F4A7C15)
		if err := os.WriteFile(filepath.Join(dir, ip.String()), []byte(id+"\r\neth0"), 0o600); err != nil {
			return err
		}
		last = ip
	}
	if last != nil {
		return os.WriteFile(filepath.Join(dir, "last_reserved_ip.0"), []byte(last.String()), 0o600)
	}
	return nil
}

// foreignLease writes one more lease as another writer (the reference, on a node
// that switched back and forth) would, high in the subnet, away from what the
// benchmark allocates.
func foreignLease(dir string, i int) error {
	ip := net.IPv4(10, 89, 200+byte(i/250), byte(i%250+2)).To4()
	return os.WriteFile(filepath.Join(dir, ip.String()), []byte(fmt.Sprintf("foreign-%d\r\neth0", i)), 0o600)
}

func benchLeases(e *env, t *testing.T) {
	tbl := e.rep.section("5. host-local with existing leases", timingHeader...)
	tbl.intro = "host-local alone in a " + leaseSubnet + ", its data dir pre-populated before timing with lease files in the " +
		"reference's on-disk format (one file per address holding `<containerID>\\r\\n<ifname>`, `last_reserved_ip.0` " +
		"naming the highest). podwire keeps an index beside the lease files. The first call on pre-populated files builds " +
		"it (one full read of the directory): the \"first call\" row is that one call per set (a single sample). When the " +
		"directory changed behind podwire's back (its mtime or a `last_reserved_ip` file differs from what podwire last " +
		"committed), the next call catches up: it stats every lease file and reads those changed since its last commit; " +
		"the \"after a foreign write\" row repeats that by writing one foreign lease, untimed, before each ADD. The reference reads no index: its ADD tries addresses after the last reserved " +
		"one, its DEL reads every lease file to find the container's."
	counts := []int{0, 10_000}
	iters := e.iters
	if e.quick {
		iters = 4
		tbl.note("bench-quick runs 4 rounds per row here")
	}
	for _, n := range counts {
		runners := map[*set]*runner{}
		var list []*runner
		for _, s := range e.sets() {
			b := e.base[s.Name]
			dataDir := t.TempDir()
			must(t, writeLeases(filepath.Join(dataDir, "bench"), n), "writing %d leases", n)
			r := &runner{label: s.Name, set: s, h: b.h, pod: b.pod, subst: map[string]string{"@LEASEDIR@": dataDir}}
			if n > 0 {
				e.leaseDirs[s.Name] = dataDir
			}
			runners[s] = r
			list = append(list, r)
		}
		list = available(tbl, list, "host-local")
		label := fmt.Sprintf("%d leases", n)
		once := func(r *runner, id string, before func() error) (time.Duration, time.Duration, error) {
			if before != nil {
				if err := before(); err != nil {
					return 0, 0, err
				}
			}
			l, err := e.conflist(r, "bench", leaseConf)
			if err != nil {
				return 0, 0, err
			}
			return e.addDel(r, l, rtFor(r, id, "eth0", nil))
		}
		rows := func(name string, res map[*runner]*pair, addOnly bool) {
			col := func(s *set, del bool) sample {
				p := res[runners[s]]
				if p == nil {
					return nil
				}
				if del {
					return p.del
				}
				return p.add
			}
			tbl.timingRow(name+" ADD", col(e.floor, false), col(e.ref, false), col(e.ours, false))
			if !addOnly {
				tbl.timingRow(name+" DEL", col(e.floor, true), col(e.ref, true), col(e.ours, true))
			}
		}
		first := e.interleave(tbl, list, 1, false, func(r *runner, i int) (time.Duration, time.Duration, error) {
			return once(r, "lease-first", nil)
		})
		rows(label+", first call after pre-population (1 sample)", first, false)
		steady := e.interleave(tbl, list, iters, false, func(r *runner, i int) (time.Duration, time.Duration, error) {
			return once(r, fmt.Sprintf("lease-%d", i), nil)
		})
		rows(label, steady, false)
		if n == 0 {
			continue
		}
		rebuild := e.interleave(tbl, list, iters, false, func(r *runner, i int) (time.Duration, time.Duration, error) {
			dir := filepath.Join(r.subst["@LEASEDIR@"], "bench")
			return once(r, fmt.Sprintf("lease-rebuild-%d", i), func() error { return foreignLease(dir, i) })
		})
		rows(label+", right after a foreign lease write:", rebuild, true)
	}
}
