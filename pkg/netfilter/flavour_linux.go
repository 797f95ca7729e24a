// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/coreos/go-iptables/iptables"
)

// IPTablesInfo is what `podwire doctor` reports of fam's iptables.
type IPTablesInfo struct {
	Path    string // "" when not installed
	Flavour string // "nf_tables", "legacy" or "unknown", from the binary it resolves to
	Version string // from go-iptables (iptables --version)
}

// ProbeIPTables finds fam's iptables, its flavour and version.
func ProbeIPTables(fam Family) IPTablesInfo {
	bin, _ := binaries(fam)
	path, err := exec.LookPath(bin)
	if err != nil {
		return IPTablesInfo{}
	}
	info := IPTablesInfo{Path: path, Flavour: "unknown"}
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		switch modeOfBinary(resolved) {
		case xtNFT:
			info.Flavour = "nf_tables"
		case xtLegacy:
			info.Flavour = "legacy"
		}
	}
	proto := iptables.ProtocolIPv4
	if fam == IPv6 {
		proto = iptables.ProtocolIPv6
	}
	if ipt, err := iptables.New(iptables.IPFamily(proto)); err == nil {
		a, b, c := ipt.GetIptablesVersion()
		info.Version = fmtVersion(a, b, c)
	}
	return info
}

// ChainExists reports whether table holds chain in fam's iptables (go-iptables).
func ChainExists(fam Family, table, chain string) (bool, error) {
	proto := iptables.ProtocolIPv4
	if fam == IPv6 {
		proto = iptables.ProtocolIPv6
	}
	ipt, err := iptables.New(iptables.IPFamily(proto))
	if err != nil {
		return false, err
	}
	return ipt.ChainExists(table, chain)
}

func fmtVersion(a, b, c int) string {
	return strconv.Itoa(a) + "." + strconv.Itoa(b) + "." + strconv.Itoa(c)
}
