// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// What bridge's verbs call for ipMasq: the backend choice for ADD, and DEL, CHECK and
// GC across both layouts, as the reference's DEL and GC do (a pod may have been made
// with another backend or another binary).

// OpenMasq returns the ipMasq backend for want (Auto probes the host, see PickMasq),
// and the kind it chose.
func OpenMasq(want Kind) (MasqBackend, Kind, error) {
	p := MasqProbe{Probe: namedProbe(want)}
	if !want.Named() {
		// RefNFT changes the choice only when both backends are there.
		if p.Probe = ProbeHost(); p.NFTables && p.IPTables {
			p.RefNFT = refCanUseNFT()
		}
	}
	k, err := PickMasq(want, p)
	if err != nil {
		return nil, "", err
	}
	if k == KindIPTables {
		return &MasqIPTables{hostXTLayout("masq")}, k, nil
	}
	return &MasqNFTables{s: hostNFTSocket()}, k, nil
}

// RemoveMasq is ipMasq's DEL: it removes o's masquerade from both layouts, whichever
// backend is configured, skipping one the node does not offer (as the reference
// does). The iptables side execs only for a family where o's chain may exist
// (xtablesMayHave). addrs are the pod's addresses when known (see MasqBackend.Remove).
func RemoveMasq(ctx context.Context, o Owner, addrs []netip.Prefix) error {
	var errs []error
	nft := &MasqNFTables{s: hostNFTSocket()}
	if err := nft.Remove(ctx, o, addrs); err != nil && ProbeHost().NFTables {
		errs = append(errs, err)
	}
	var need Families
	chain := MasqChain(o)
	for _, fam := range removalFamilies(addrs).list() {
		may, err := xtablesMayHave(nft, fam, chain)
		errs = append(errs, err)
		if may {
			need |= fam.bit()
		}
	}
	xt := &MasqIPTables{hostXTLayout("masq")}
	errs = append(errs, xt.forFamilies(need, true, func(fam Family) error { return xt.removeFamily(ctx, fam, o, addrs) }))
	return errors.Join(errs...)
}

// CheckMasq is ipMasq's CHECK: p's rules in the backend want picks, or, when none of
// them is there, in the other layout (a pod made by the reference with its default
// backend, or before ipMasqBackend changed).
func CheckMasq(ctx context.Context, want Kind, p MasqPlan) error {
	fw, k, err := OpenMasq(want)
	if err != nil {
		return err
	}
	err = fw.Check(ctx, p)
	if !IsNotFound(err) {
		return err
	}
	var other MasqBackend
	switch {
	case k == KindNFTables && hostXT().Installed(IPv4) && (p.Families()&V6 == 0 || hostXT().Installed(IPv6)):
		other = &MasqIPTables{hostXTLayout("masq")}
	case k == KindIPTables:
		other = &MasqNFTables{s: hostNFTSocket()}
	default:
		return err
	}
	if oerr := other.Check(ctx, p); oerr == nil || !IsNotFound(oerr) {
		return oerr
	}
	return err
}

// GCMasq is ipMasq's GC: the stale masquerades of network in every backend the node
// offers.
func GCMasq(ctx context.Context, network string, keep cniplumb.Owners) error {
	return forBackends(ProbeHost(), func(k Kind) error {
		if k == KindNFTables {
			return (&MasqNFTables{s: hostNFTSocket()}).GC(ctx, network, keep)
		}
		return (&MasqIPTables{hostXTLayout("masq")}).GC(ctx, network, keep)
	})
}

// The flavours of iptables binaries: which kernel interface they drive.
const (
	flavourNFT    = "nf_tables" // iptables-nft: rules in nf_tables tables ip/ip6 nat
	flavourLegacy = "legacy"    // iptables-legacy: rules in x_tables
)

// flavourOfPath is flavourOf the file path resolves to ("unknown" when that cannot be
// resolved).
func flavourOfPath(path string) string {
	resolved, _ := filepath.EvalSymlinks(path)
	return flavourOf(resolved)
}

// flavourOf tells the flavour from the file the binary resolves to
// (xtables-nft-multi, xtables-legacy-multi, iptables-nft, ...), without running it.
func flavourOf(resolved string) string {
	switch base := filepath.Base(resolved); {
	case strings.Contains(base, "nft"):
		return flavourNFT
	case strings.Contains(base, "legacy"):
		return flavourLegacy
	}
	return "unknown"
}

// xtablesMayHave reports whether chain may exist in fam's iptables nat table, as
// cheaply as that can be known; true means "list it to find out". On iptables-nft
// that is one netlink lookup of the chain in table ip (ip6) nat; on iptables-legacy
// the chain can only exist once the legacy nat table has been used in this netns.
func xtablesMayHave(nft *MasqNFTables, fam Family, chain string) (bool, error) {
	bin, _ := binaries(fam)
	path, err := exec.LookPath(bin)
	if err != nil {
		// No iptables: only a chain iptables-nft left behind could be there, and it
		// could not be removed without the binary.
		if exists, err := nft.xtablesChainExists(fam, chain); err == nil && exists {
			return false, fmt.Errorf("%s masquerade chain %s exists in the nat table but %s is not installed; install iptables so DEL can remove it", fam, chain, bin)
		}
		return false, nil
	}
	switch flavourOfPath(path) {
	case flavourNFT:
		exists, err := nft.xtablesChainExists(fam, chain)
		return exists || err != nil, nil // an error: cannot tell, so list it
	case flavourLegacy:
		return legacyNATInUse(fam), nil
	}
	return true, nil
}

// legacyNATInUse reports whether the legacy x_tables nat table of fam exists in this
// network namespace; it appears with its first use and only then can hold chains.
func legacyNATInUse(fam Family) bool {
	file := "/proc/net/ip_tables_names"
	if fam == IPv6 {
		file = "/proc/net/ip6_tables_names"
	}
	b, err := os.ReadFile(file)
	if err != nil {
		// No x_tables in this kernel (or no /proc): nothing legacy can exist.
		return !errors.Is(err, os.ErrNotExist)
	}
	return slices.Contains(strings.Fields(string(b)), "nat")
}

// refCanUseNFT reports whether the reference plugin could drive nftables on this host:
// it runs `nft` and requires version 1.0.1 or later (knftables). The verdict is cached
// per nft binary (cniplumb.FileVerdict): only the first call after an nft install or
// upgrade runs `nft --version`.
func refCanUseNFT() bool {
	path, err := exec.LookPath("nft")
	if err != nil {
		return false
	}
	return cniplumb.FileVerdict("nft-version", path, "knftables>=1.0.1", func() bool {
		out, err := exec.Command(path, "--version").Output()
		return err == nil && nftVersionOK(string(out))
	})
}

// nftVersionOK reports whether `nft --version` output is a version knftables accepts
// (1.0.1 or later).
func nftVersionOK(out string) bool {
	out = strings.TrimSpace(out)
	if !strings.HasPrefix(out, "nftables v") {
		return false
	}
	return !strings.HasPrefix(out, "nftables v0.") && !strings.HasPrefix(out, "nftables v1.0.0 ") && out != "nftables v1.0.0"
}
