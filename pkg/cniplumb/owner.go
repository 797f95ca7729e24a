// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// Owner identifies one attachment: a network, a container and the interface name
// inside it. Every kernel object and lease podwire creates belongs to exactly one Owner,
// so two networks attached to one container (Multus) never touch each other's state.
type Owner struct {
	Network     string
	ContainerID string
	IfName      string
}

// Key is the stable text form of the owner, used in rule comments and for hashing.
func (o Owner) Key() string {
	return o.Network + "/" + o.ContainerID + "/" + o.IfName
}

func (o Owner) String() string { return o.Key() }

// Hash is the hex SHA-256 of Key. Kernel names derive from it so they are stable
// across ADD, CHECK, DEL and GC without being stored anywhere.
func (o Owner) Hash() string {
	sum := sha256.Sum256([]byte(o.Key()))
	return hex.EncodeToString(sum[:])
}

// KernelName returns prefix followed by as much of the owner hash as fits in max
// bytes. The hash goes right after the short prefix so truncation keeps names unique.
// It fails, rather than panicking, when the prefix leaves fewer than 8 hash digits.
func (o Owner) KernelName(prefix string, max int) (string, error) {
	n := max - len(prefix)
	if n < 8 {
		return "", fmt.Errorf("kernel name prefix %q leaves %d of %d bytes for the owner hash; at least 8 are needed", prefix, n, max)
	}
	h := o.Hash()
	if n > len(h) {
		n = len(h)
	}
	return prefix + h[:n], nil
}

// Owners is a set of attachments, as GC receives them in cni.dev/valid-attachments.
type Owners map[Owner]bool

// Has reports whether o is in the set.
func (s Owners) Has(o Owner) bool { return s[o] }
