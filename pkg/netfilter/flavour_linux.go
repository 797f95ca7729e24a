// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"os/exec"
	"strconv"
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
	info := IPTablesInfo{Path: path, Flavour: flavourOfPath(path)}
	if ipt, err := hostXT().ipt(fam); err == nil {
		a, b, c := ipt.GetIptablesVersion()
		info.Version = strconv.Itoa(a) + "." + strconv.Itoa(b) + "." + strconv.Itoa(c)
	}
	return info
}

// ChainExists reports whether table holds chain in fam's iptables (go-iptables).
func ChainExists(fam Family, table, chain string) (bool, error) {
	ipt, err := hostXT().ipt(fam)
	if err != nil {
		return false, err
	}
	return ipt.ChainExists(table, chain)
}
