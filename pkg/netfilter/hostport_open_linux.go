package netfilter

import (
	"os/exec"

	"github.com/google/nftables"
)

// OpenHostPorts returns the host-port backend for want and the kind it chose. Auto
// prefers nftables, as Pick does; a backend asked for by name but missing is a code-50
// error. Auto asks the kernel on the socket the nftables backend then keeps using (one
// netlink round trip, no extra socket: closing an nfnetlink socket can wait for the
// kernel to free rules another process deleted), and looks iptables up in PATH only
// when nftables is unusable. iptables costs one PATH lookup; nftables nothing (its first
// netlink call reports a kernel without nf_tables).
func OpenHostPorts(want Kind) (HostPortBackend, Kind, error) {
	var p Probe
	switch want {
	case KindNFTables:
		p.NFTables = true
	case KindIPTables:
		_, err := exec.LookPath("iptables-restore")
		p.IPTables = err == nil
	default:
		nft := NewNFTables()
		if nftUsable(nft) {
			return &HostPortNFTables{nft: nft}, KindNFTables, nil
		}
		_, e1 := exec.LookPath("iptables")
		_, e2 := exec.LookPath("iptables-restore")
		p.IPTables = e1 == nil && e2 == nil
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
