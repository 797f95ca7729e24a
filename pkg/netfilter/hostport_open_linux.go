package netfilter

import "os/exec"

// OpenHostPorts returns the host-port backend for want and the kind it chose. Auto
// prefers nftables, as Pick does; a backend asked for by name but missing is a code-50
// error. It costs one netlink round trip and two PATH lookups for Auto, one PATH
// lookup for iptables and nothing for nftables (whose first netlink call reports a
// kernel without nf_tables).
func OpenHostPorts(want Kind) (HostPortBackend, Kind, error) {
	var p Probe
	switch want {
	case KindNFTables:
		p.NFTables = true
	case KindIPTables:
		_, err := exec.LookPath("iptables-restore")
		p.IPTables = err == nil
	default:
		p = ProbeHost()
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
