package netfilter

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkXTDirectList: listing a CNI-HOSTPORT-DNAT-like chain of 100 jumps with
// portmap's comments, what every portmap ADD and DEL reads on a node with 100 pods.
func BenchmarkXTDirectList(b *testing.B) {
	requireNFTIPTables(b, IPv4)
	_, err := inScratchNetns(func() ([]string, error) {
		d := &xtDirect{fam: IPv4}
		defer d.drop()
		var s strings.Builder
		s.WriteString("*nat\n:PW-TOP - [0:0]\n")
		for i := range 100 {
			fmt.Fprintf(&s, ":CNI-DN-%021x - [0:0]\n", i)
			fmt.Fprintf(&s, "-A PW-TOP -p tcp -m multiport --dports %d -m comment --comment \"pw:6addefb2:%016x:69e24d1c net1/pod%d/eth0\" -j CNI-DN-%021x\n", 20000+i, i, i, i)
		}
		s.WriteString("COMMIT\n")
		if err := d.restore(s.String()); err != nil {
			return nil, err
		}
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			l, err := d.list("nat", "PW-TOP")
			if err != nil || strings.Count(l, "\n") != 101 {
				return nil, fmt.Errorf("listing: %v\n%s", err, l)
			}
		}
		return nil, nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
