// SPDX-License-Identifier: Apache-2.0

package ipam

import (
	"context"
	"net"
)

// Owner is the attachment a lease belongs to. A lease written by an old reference
// host-local that recorded only the container ID has an empty IfName (a "legacy"
// lease); it matches any interface of that container, as in the reference.
type Owner struct {
	ContainerID string
	IfName      string
}

func (o Owner) String() string {
	if o.IfName == "" {
		return o.ContainerID + " (legacy lease without interface name)"
	}
	return o.ContainerID + "/" + o.IfName
}

// Lease is one leased address.
type Lease struct {
	IP    net.IP
	Owner Owner
	// PrevBoot is set when the lease is known to have existed before the current boot:
	// its container's network namespace cannot have survived the reboot, so the
	// address may be reclaimed.
	PrevBoot bool
	// Broken marks a lease file with no content that is older than the store's grace
	// period: a writer crashed between creating and filling it. It has no owner and
	// may be reclaimed.
	Broken bool
	// Unreadable marks an address whose lease file was replaced by something that is
	// not a lease file (a symlink, a device node), which the store never follows or
	// reads. The address counts as taken. Owner is set only when the store's own
	// records say whose it is (Leases); All and Holder leave it empty.
	Unreadable bool
}

// Store holds the leases of one network. Do runs f as one transaction under the
// network's exclusive lock, so concurrent plugin processes (ours or the reference's)
// see each other's changes only between transactions. Do does not roll back: a
// failing f must undo its own changes through the Tx (the allocator does).
type Store interface {
	Do(ctx context.Context, f func(Tx) error) error
}

// Tx is what the allocator may do inside a Store transaction. Everything but All is
// expected to cost the same whether the network has ten leases or ten thousand.
type Tx interface {
	// Leases returns o's leases. When o has none, it returns the container's legacy
	// leases (Owner.IfName ""), as the reference's release does.
	Leases(o Owner) ([]Lease, error)
	// Renew marks o's leases as belonging to the current boot (the attachment was just
	// confirmed alive by an ADD), and writes o's lease again where something
	// Unreadable took its place.
	Renew(o Owner) error
	// Adopt makes the lease on ip, held by from, to's, without the address being free
	// at any moment. It does nothing when ip is no longer from's.
	Adopt(ip net.IP, from, to Owner) error
	// Holder returns the lease on ip, and false when ip is free.
	Holder(ip net.IP) (Lease, bool, error)
	// Reserve leases ip to o if it is free (a Broken lease counts as free) and records
	// ip as the last reserved address of range set set. It returns false when ip is
	// taken.
	Reserve(o Owner, ip net.IP, set int) (bool, error)
	// LastReserved is the last address reserved from range set set, or nil.
	LastReserved(set int) (net.IP, error)
	// Release removes every lease Leases(o) returns. None is not an error.
	Release(o Owner) error
	// ReleaseIP removes the lease on ip if it is still held by o (for a Broken or an
	// Unreadable lease of All, o is the zero Owner; an Unreadable lease of Leases(o)
	// is o's). A lease that is gone or held by someone else is left alone.
	ReleaseIP(ip net.IP, o Owner) error
	// All lists every lease of the network. It reads the whole store.
	All() ([]Lease, error)
	// Writable fails when a new lease could not be written (read-only or full disk).
	Writable() error
}
