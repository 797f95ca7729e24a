// SPDX-License-Identifier: Apache-2.0

package tc

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// An IFB's name is only a hash, so its alias carries the owner: bandwidth's DEL and
// GC, and `podwire inspect`, tell from it which attachment (and network) an IFB
// belongs to, and which host veth redirects into it.
const (
	// AliasPrefix starts the alias "podwire:<network>/<containerID>/<ifname> dev=<veth>".
	AliasPrefix = "podwire:"
	// hashedAliasPrefix is used instead when that does not fit the kernel's 255-byte
	// alias: the network then appears as a hash.
	hashedAliasPrefix = "podwire#"
	maxAlias          = 255
	// devTag separates the host veth's name at the end of the alias.
	devTag = " dev="
)

// PodwireAlias reports whether an IFB alias is one podwire writes.
func PodwireAlias(alias string) bool {
	return strings.HasPrefix(alias, AliasPrefix) || strings.HasPrefix(alias, hashedAliasPrefix)
}

// OwnedBy reports whether an IFB alias names o as its attachment.
func OwnedBy(alias string, o cniplumb.Owner) bool {
	base := ownerAlias(o)
	return alias == base || strings.HasPrefix(alias, base+devTag) || (len(base) >= maxAlias && alias == base[:maxAlias])
}

// AliasFor is the IFB alias naming the owner and, when it fits, the host veth, so GC
// can take the redirect off a veth that outlived its attachment.
func AliasFor(o cniplumb.Owner, dev string) string {
	a := ownerAlias(o)
	if len(a)+len(devTag)+len(dev) <= maxAlias {
		return a + devTag + dev
	}
	return a[:min(len(a), maxAlias)]
}

// ownerAlias is the part of the alias that names the attachment.
func ownerAlias(o cniplumb.Owner) string {
	a := AliasPrefix + o.Key()
	if len(a) > maxAlias {
		a = networkTag(o.Network) + o.ContainerID + "/" + o.IfName
	}
	return a
}

// DevOf is the host veth an alias names, or "".
func DevOf(alias string) string {
	if i := strings.LastIndex(alias, devTag); i >= 0 {
		return alias[i+len(devTag):]
	}
	return ""
}

// OwnerOfAlias reads the attachment from an alias in its plain form; ok is false for
// a hashed network, a cut alias or a foreign one.
func OwnerOfAlias(alias string) (o cniplumb.Owner, ok bool) {
	if !strings.HasPrefix(alias, AliasPrefix) {
		return o, false
	}
	key := strings.TrimPrefix(alias, AliasPrefix)
	if i := strings.LastIndex(key, devTag); i >= 0 {
		key = key[:i]
	}
	f := strings.Split(key, "/")
	if len(f) != 3 {
		return o, false
	}
	o = cniplumb.Owner{Network: f[0], ContainerID: f[1], IfName: f[2]}
	return o, OwnedBy(alias, o)
}

func networkTag(network string) string {
	sum := sha256.Sum256([]byte(network))
	return hashedAliasPrefix + hex.EncodeToString(sum[:8]) + "/"
}

// OfNetwork reports whether an IFB alias says it belongs to network.
func OfNetwork(alias, network string) bool {
	return strings.HasPrefix(alias, AliasPrefix+network+"/") || strings.HasPrefix(alias, networkTag(network))
}

// PlanGC picks the IFBs of network whose attachment is not in valid, each with the
// host veth its alias names as a hint (Removal.OnlyIfRedirected). Both of podwire's
// names count (pwb… and the reference's bwp…); an IFB is podwire's and of this network
// by its alias, and kept when the alias names a valid attachment. IFBs of other
// networks, and IFBs without podwire's alias (the reference's), are never picked.
// bandwidth's GC removes exactly these; `podwire gc --dry-run` lists them.
func PlanGC(ifbs []IFB, network string, valid cniplumb.Owners) []Removal {
	var out []Removal
	for _, i := range ifbs {
		if !strings.HasPrefix(i.Name, "pwb") && !strings.HasPrefix(i.Name, "bwp") {
			continue
		}
		if !OfNetwork(i.Alias, network) {
			continue
		}
		keep := false
		for o := range valid {
			keep = keep || OwnedBy(i.Alias, o)
		}
		if !keep {
			out = append(out, Removal{Dev: DevOf(i.Alias), IFBs: []string{i.Name}, OnlyIfRedirected: true})
		}
	}
	return out
}
