// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// Owner is the attachment a rule belongs to.
type Owner = cniplumb.Owner

// maxTag bounds a tag to what `nft` shows as a comment (iptables allows 256).
const maxTag = nftMaxComment

const tagPrefix = "pw:"

// Tag is what every rule carries to name its owner:
//
//	pw:<network hash 8>:<owner hash 16>:<rule fingerprint 8> <network>/<containerID>/<ifname>
//
// The hashes make removal and GC exact even when a very long owner key had to be left
// out to fit the comment limit; the key is there for operators reading `nft list
// ruleset` or `iptables -S`.
type Tag struct {
	NetworkHash string // first 8 hex digits of sha256(network)
	ID          OwnerID
	Fingerprint string // first 8 hex digits of sha256(rule text)
	// Owner is the full owner when the key fitted into the tag; otherwise zero.
	Owner Owner
}

func hash8(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:4])
}

func tagFor(o Owner, r Rule) Tag {
	return Tag{NetworkHash: hash8(o.Network), ID: IDOf(o), Fingerprint: hash8(r.String()), Owner: o}
}

// String is the tag's text as stored in the kernel.
func (t Tag) String() string {
	s := tagPrefix + t.NetworkHash + ":" + string(t.ID) + ":" + t.Fingerprint
	if t.Owner != (Owner{}) {
		if k := " " + t.Owner.Key(); len(s)+len(k) <= maxTag {
			s += k
		}
	}
	return s
}

// ParseTag parses a stored tag; ok is false for comments podwire did not write.
func ParseTag(s string) (t Tag, ok bool) {
	s = strings.Trim(s, "\"")
	if !strings.HasPrefix(s, tagPrefix) {
		return Tag{}, false
	}
	head, key, _ := strings.Cut(s[len(tagPrefix):], " ")
	parts := strings.Split(head, ":")
	if len(parts) != 3 || len(parts[0]) != 8 || len(parts[1]) != 16 || len(parts[2]) != 8 {
		return Tag{}, false
	}
	t = Tag{NetworkHash: parts[0], ID: OwnerID(parts[1]), Fingerprint: parts[2]}
	if f := strings.Split(key, "/"); len(f) == 3 {
		o := Owner{Network: f[0], ContainerID: f[1], IfName: f[2]}
		if IDOf(o) == t.ID {
			t.Owner = o
		}
	}
	return t, true
}

// OwnerID identifies an owner in the kernel: 16 hex digits of its hash. Removal and
// GC work on IDs, needing neither the owner's addresses nor a key fitted into the tag.
type OwnerID string

// IDOf returns o's ID.
func IDOf(o Owner) OwnerID { return OwnerID(o.Hash()[:16]) }

// tagKey is an owner's key in the layouts that tag their rules: its ID.
func tagKey(o Owner) string { return string(IDOf(o)) }
