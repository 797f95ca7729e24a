// SPDX-License-Identifier: Apache-2.0

package ipam

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
)

// Fake is an in-memory Store for unit tests. It models the disk store's behaviour:
// one lease per address, leases remember the boot they were made in, broken leases
// can be injected, and a write failure can be armed. It does not roll back a failed
// transaction, exactly like the disk store, so tests see whether the allocator undoes
// its own work.
type Fake struct {
	mu     sync.Mutex
	boot   string
	leases map[string]fakeLease // by IP string
	last   map[int]net.IP
	failOn string // "reserve" or "write": the next such operation fails
}

type fakeLease struct {
	ip         net.IP
	owner      Owner // for an unreadable lease: who held it before (the disk store's index)
	boot       string
	broken     bool
	unreadable bool
}

var _ Store = (*Fake)(nil)

// ErrFakeDiskFull is what an armed Fake failure returns.
var ErrFakeDiskFull = errors.New("no space left on device (fake)")

// NewFake returns an empty store whose current boot is "boot0".
func NewFake() *Fake {
	return &Fake{boot: "boot0", leases: map[string]fakeLease{}, last: map[int]net.IP{}}
}

// Reboot changes the current boot ID, as a node reboot does.
func (f *Fake) Reboot(boot string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.boot = boot
}

// PutBroken adds an empty, stale lease file on ip (a writer crashed).
func (f *Fake) PutBroken(ip net.IP) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leases[ip.String()] = fakeLease{ip: canonical(ip), broken: true}
}

// PutUnreadable replaces the lease file on ip (or an absent one) by something that
// is not a lease file, as a symlink planted in the disk store's directory.
func (f *Fake) PutUnreadable(ip net.IP) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.leases[canonical(ip).String()]
	l.ip, l.broken, l.unreadable = canonical(ip), false, true
	f.leases[l.ip.String()] = l
}

// FailNext arms a failure: "reserve" fails the next Reserve, "write" makes Writable
// and the next Reserve fail.
func (f *Fake) FailNext(what string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failOn = what
}

// Dump lists the leases sorted by address, one "ip owner [boot] [broken]" per line,
// then the last reserved addresses.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var lines []string
	for _, l := range f.leases {
		switch {
		case l.broken:
			lines = append(lines, l.ip.String()+" broken")
		case l.unreadable:
			lines = append(lines, l.ip.String()+" unreadable")
		case l.boot != f.boot:
			lines = append(lines, fmt.Sprintf("%s %s/%s boot=%s", l.ip, l.owner.ContainerID, l.owner.IfName, l.boot))
		default:
			lines = append(lines, fmt.Sprintf("%s %s/%s", l.ip, l.owner.ContainerID, l.owner.IfName))
		}
	}
	sort.Slice(lines, func(i, j int) bool { return ipLess(lines[i], lines[j]) })
	var sets []int
	for s := range f.last {
		sets = append(sets, s)
	}
	sort.Ints(sets)
	for _, s := range sets {
		lines = append(lines, fmt.Sprintf("last.%d %s", s, f.last[s]))
	}
	return strings.Join(lines, "\n")
}

func ipLess(a, b string) bool {
	ia := canonical(net.ParseIP(strings.Fields(a)[0]))
	ib := canonical(net.ParseIP(strings.Fields(b)[0]))
	if len(ia) != len(ib) {
		return len(ia) < len(ib)
	}
	return cmpIP(ia, ib) < 0
}

// Do runs fn under the store's lock.
func (f *Fake) Do(ctx context.Context, fn func(Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return fn(fakeTx{f})
}

type fakeTx struct{ f *Fake }

func (t fakeTx) lease(l fakeLease) Lease {
	if l.unreadable {
		return Lease{IP: l.ip, Unreadable: true}
	}
	return Lease{IP: l.ip, Owner: l.owner, PrevBoot: !l.broken && l.boot != t.f.boot, Broken: l.broken}
}

func (t fakeTx) Leases(o Owner) ([]Lease, error) {
	var out []Lease
	for _, want := range []Owner{o, {ContainerID: o.ContainerID}} {
		for _, l := range t.f.leases {
			if !l.broken && l.owner == want {
				ls := t.lease(l)
				ls.Owner = want
				out = append(out, ls)
			}
		}
		if len(out) > 0 {
			break
		}
	}
	sort.Slice(out, func(i, j int) bool { return ipLess(out[i].IP.String(), out[j].IP.String()) })
	return out, nil
}

func (t fakeTx) Renew(o Owner) error {
	for k, l := range t.f.leases {
		if !l.broken && l.owner == o {
			l.boot, l.unreadable = t.f.boot, false
			t.f.leases[k] = l
		}
	}
	return nil
}

func (t fakeTx) Adopt(ip net.IP, from, to Owner) error {
	k := canonical(ip).String()
	if l, ok := t.f.leases[k]; ok && !l.broken && !l.unreadable && l.owner == from {
		l.owner = to
		t.f.leases[k] = l
	}
	return nil
}

func (t fakeTx) Holder(ip net.IP) (Lease, bool, error) {
	l, ok := t.f.leases[canonical(ip).String()]
	if !ok {
		return Lease{}, false, nil
	}
	return t.lease(l), true, nil
}

func (t fakeTx) Reserve(o Owner, ip net.IP, set int) (bool, error) {
	if t.f.failOn == "reserve" || t.f.failOn == "write" {
		t.f.failOn = ""
		return false, fmt.Errorf("writing lease for %s: %w", ip, ErrFakeDiskFull)
	}
	ip = canonical(ip)
	if l, ok := t.f.leases[ip.String()]; ok && !l.broken {
		return false, nil
	}
	t.f.leases[ip.String()] = fakeLease{ip: ip, owner: o, boot: t.f.boot}
	t.f.last[set] = ip
	return true, nil
}

func (t fakeTx) LastReserved(set int) (net.IP, error) { return t.f.last[set], nil }

func (t fakeTx) Release(o Owner) error {
	ls, _ := t.Leases(o)
	for _, l := range ls {
		delete(t.f.leases, l.IP.String())
	}
	return nil
}

func (t fakeTx) ReleaseIP(ip net.IP, o Owner) error {
	k := canonical(ip).String()
	if l, ok := t.f.leases[k]; ok && (l.owner == o || l.unreadable && o == Owner{}) {
		delete(t.f.leases, k)
	}
	return nil
}

func (t fakeTx) All() ([]Lease, error) {
	var out []Lease
	for _, l := range t.f.leases {
		out = append(out, t.lease(l))
	}
	sort.Slice(out, func(i, j int) bool { return ipLess(out[i].IP.String(), out[j].IP.String()) })
	return out, nil
}

func (t fakeTx) Writable() error {
	if t.f.failOn == "write" {
		return ErrFakeDiskFull
	}
	return nil
}
