package netfilter

import (
	"os/exec"

	"github.com/google/nftables"
)

// OpenHostPorts returns the host-port backend for want and the kind it chose. Auto
// picks what the reference portmap picks when its "backend" is unset — iptables when
// iptables and iptables-restore are installed, nftables otherwise — because the
// reference's DEL only looks in its own default backend: a node that switches back to
// the reference under live pods must find their rules there. Configure "nftables" for
// the faster, exec-free backend. A backend asked for by name but missing is a code-50
// error. nftables is probed on the socket its backend then keeps using (closing an
// nfnetlink socket can wait for the kernel to free rules another process deleted).
func OpenHostPorts(want Kind) (HostPortBackend, Kind, error) {
	p := namedProbe(want)
	if !want.Named() {
		_, e1 := exec.LookPath("iptables")
		_, e2 := exec.LookPath("iptables-restore")
		if e1 == nil && e2 == nil {
			return NewHostPortIPTables(), KindIPTables, nil
		}
		nft := NewNFTables()
		if nftUsable(nft) {
			return &HostPortNFTables{nft: nft}, KindNFTables, nil
		}
	}
	k, err := Pick(want, p)
	if err != nil {
		return nil, "", err
	}
	if k == KindIPTables {
		return NewHostPortIPTables(), k, nil
	}
	return NewHostPortNFTables(), k, nil
}

// nftUsable reports whether the kernel answers nf_tables requests, asked on b's own
// socket.
func nftUsable(b *NFTables) bool {
	c, done, err := b.conn()
	if err != nil {
		return false
	}
	defer done()
	_, err = c.ListTablesOfFamily(nftables.TableFamilyINet)
	return err == nil
}
