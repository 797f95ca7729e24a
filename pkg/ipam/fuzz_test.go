// SPDX-License-Identifier: Apache-2.0

package ipam

import (
	"testing"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// FuzzParseConf feeds arbitrary configurations and CNI_ARGS to the parser. Errors are
// fine; a panic is not, every error must carry a CNI code, and whatever parses must
// satisfy the invariants the allocator relies on.
func FuzzParseConf(f *testing.F) {
	for _, s := range []string{
		`{"name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64","rangeStart":"fd00::5"}]]}}`,
		`{"name":"n","ipam":{"subnet":"10.0.0.0/30","gateway":"10.0.0.2","routes":[{"dst":"0.0.0.0/0"}]}}`,
		`{"name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"10.0.1.0/24","rangeEnd":"10.0.1.9"}]]},"runtimeConfig":{"ips":["10.0.1.3"]}}`,
		`{"name":"n","ipam":{},"runtimeConfig":{"ipRanges":[[{"subnet":"::ffff:10.0.0.0/120"}]]}}`,
		`{"ipam":null}`, `[]`, `{"ipam":{"ranges":[[]]}}`,
	} {
		f.Add([]byte(s), "IP=10.0.0.7")
	}
	f.Fuzz(func(t *testing.T, stdin []byte, args string) {
		c, err := ParseConf(stdin, args)
		if err != nil {
			if cniplumb.Code(err) == cniplumb.CodeInternal {
				t.Fatalf("error without a CNI code: %v", err)
			}
			return
		}
		for i, set := range c.RangeSets {
			for _, r := range set {
				if cmpIP(r.RangeStart, r.RangeEnd) > 0 || !r.Subnet.Contains(r.RangeStart) || !r.Subnet.Contains(r.RangeEnd) || !r.Subnet.Contains(r.Gateway) {
					t.Fatalf("set %d: inconsistent range %+v", i, r)
				}
				if r.usable().Sign() <= 0 {
					t.Fatalf("set %d: range %s has no usable address", i, r.String())
				}
			}
			// The walk yields every usable address once (bounded for big ranges).
			it := NewIter(set, nil)
			seen := map[string]bool{}
			for ip, r := it.Next(); ip != nil && len(seen) < 300; ip, r = it.Next() {
				if seen[ip.String()] || ip.Equal(r.Gateway) || !r.Contains(ip) {
					t.Fatalf("set %d: walk yielded %s twice, or the gateway, or outside its range", i, ip)
				}
				seen[ip.String()] = true
			}
			if len(seen) == 0 {
				t.Fatalf("set %d: walk yielded nothing", i)
			}
		}
		for i, q := range c.Requested {
			if !c.RangeSets[i].Contains(q.IP) {
				t.Fatalf("request %s assigned to set %d that does not contain it", q.IP, i)
			}
		}
	})
}
