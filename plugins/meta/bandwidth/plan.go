package main

import (
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/tc"
)

const (
	// ifbPrefix starts every IFB name; the owner hash fills the other 12 of 15 bytes.
	ifbPrefix = "pwb"
	// aliasPrefix starts the IFB's alias, which carries the owner so GC can tell which
	// network an IFB belongs to (its name is only a hash).
	aliasPrefix = "podwire:"
	// hashedAliasPrefix is used instead when "podwire:<network>/<id>/<ifname>" does not
	// fit the kernel's 255-byte alias: the network then appears as a hash.
	hashedAliasPrefix = "podwire#"
	maxAlias          = 255
	maxIfName         = 15
)

// ifbName is podwire's own IFB name for an attachment: derived from network, container
// ID and interface name, so two interfaces of one pod get two IFBs. It is used when the
// reference's name (referenceIFBName) is taken by another attachment.
func ifbName(o cniplumb.Owner) (string, error) {
	return o.KernelName(ifbPrefix, maxIfName)
}

// referenceIFBName is the IFB the reference plugin creates for a container of a
// network ("bwp" and the SHA-512 of network name and container ID). An attachment's
// IFB gets this name when it is free, so the reference's DEL, which deletes it by
// name, also removes podwire's IFB after a node switches back; podwire's DEL removes
// it when it has no podwire alias (the reference made it) or this attachment's.
func referenceIFBName(network, containerID string) string {
	sum := sha512.Sum512([]byte(network + containerID))
	return ("bwp" + hex.EncodeToString(sum[:]))[:maxIfName]
}

// podwireAlias reports whether an IFB alias is one podwire writes.
func podwireAlias(alias string) bool {
	return strings.HasPrefix(alias, aliasPrefix) || strings.HasPrefix(alias, hashedAliasPrefix)
}

// ownedBy reports whether an IFB alias names o as its attachment.
func ownedBy(alias string, o cniplumb.Owner) bool {
	base := ownerAlias(o)
	return alias == base || strings.HasPrefix(alias, base+devTag) || (len(base) >= maxAlias && alias == base[:maxAlias])
}

// devTag separates the host veth's name at the end of the alias.
const devTag = " dev="

// aliasFor is the IFB alias naming the owner and, when it fits, the host veth, so GC
// can take the redirect off a veth that outlived its attachment.
func aliasFor(o cniplumb.Owner, dev string) string {
	a := ownerAlias(o)
	if len(a)+len(devTag)+len(dev) <= maxAlias {
		return a + devTag + dev
	}
	return a[:min(len(a), maxAlias)]
}

// ownerAlias is the part of the alias that names the attachment.
func ownerAlias(o cniplumb.Owner) string {
	a := aliasPrefix + o.Key()
	if len(a) > maxAlias {
		a = networkTag(o.Network) + o.ContainerID + "/" + o.IfName
	}
	return a
}

// devOf is the host veth an alias names, or "".
func devOf(alias string) string {
	if i := strings.LastIndex(alias, devTag); i >= 0 {
		return alias[i+len(devTag):]
	}
	return ""
}

func networkTag(network string) string {
	sum := sha256.Sum256([]byte(network))
	return hashedAliasPrefix + hex.EncodeToString(sum[:8]) + "/"
}

// ofNetwork reports whether an IFB alias says it belongs to network.
func ofNetwork(alias, network string) bool {
	return strings.HasPrefix(alias, aliasPrefix+network+"/") || strings.HasPrefix(alias, networkTag(network))
}

// planShaping is the tc plan for an attachment whose host-side veth is dev with the
// given MTU, and whose IFB is ifb (see pickIFB). It is pure; req has been validated, so
// sizing errors are bugs.
func planShaping(o cniplumb.Owner, req Request, dev, ifb string, mtu int) (tc.Plan, error) {
	var err error
	p := tc.Plan{Dev: dev, MTU: mtu, IFB: ifb, Alias: aliasFor(o, dev)}
	size := func(d Direction) (*tc.TBF, error) {
		if d.Rate == 0 {
			return nil, nil
		}
		t, err := tc.SizeTBF(d.Rate, d.Burst, mtu)
		if err != nil {
			return nil, fmt.Errorf("sizing the TBF for %s: %w", d, err)
		}
		return &t, nil
	}
	if p.Ingress, err = size(req.Ingress); err != nil {
		return tc.Plan{}, err
	}
	if p.Egress, err = size(req.Egress); err != nil {
		return tc.Plan{}, err
	}
	return p, nil
}

// planGC picks the IFBs of network whose attachment is not in valid, each with the
// host veth its alias names as a hint (Removal.OnlyIfRedirected). Both of podwire's
// names count (pwb… and the reference's bwp…); an IFB is podwire's and of this network
// by its alias, and kept when the alias names a valid attachment. IFBs of other
// networks, and IFBs without podwire's alias (the reference's), are never picked.
func planGC(ifbs []tc.IFB, network string, valid cniplumb.Owners) []tc.Removal {
	var out []tc.Removal
	for _, i := range ifbs {
		if !strings.HasPrefix(i.Name, ifbPrefix) && !strings.HasPrefix(i.Name, "bwp") {
			continue
		}
		if !ofNetwork(i.Alias, network) {
			continue
		}
		keep := false
		for o := range valid {
			keep = keep || ownedBy(i.Alias, o)
		}
		if !keep {
			out = append(out, tc.Removal{Dev: devOf(i.Alias), IFBs: []string{i.Name}, OnlyIfRedirected: true})
		}
	}
	return out
}
