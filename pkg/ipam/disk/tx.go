// SPDX-License-Identifier: Apache-2.0

package disk

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/ipam"
)

// tx is one locked operation on the store. It reaches every file through a
// descriptor of its directory and one name, never following a symlink (see fs.go).
type tx struct {
	s          *Store
	lk         *locked            // the network directory and lock file, locked by Do
	dir        int                // the network directory (lk.dir)
	side       int                // .podwire, opened by begin (-1 before)
	owners     int                // .podwire/owners, opened by begin (-1 before)
	spare      int                // .podwire/spare: -1 until first needed, -2 if unusable
	recs       map[string]*record // index entries read or written so far; nil = none
	last       map[string]string  // last_reserved_ip.<set> contents
	stateDirty bool               // the index was rebuilt
	rebuilt    bool               // ... in this transaction
	changedDir bool               // a lease or last_reserved_ip file was created or removed

	spares []string // names in .podwire/spare; nil until listed

	// tmp is this call's staging file in .podwire, lease.<random>.tmp ("" until first
	// needed). It is private to the call: concurrent calls (ours, or an older podwire
	// whose lock file was removed) never write into each other's.
	tmp      string
	tmpReady bool // tmp holds tmpOwner's lease, written, not yet placed
	tmpOwner ipam.Owner
	tmpID    ident
}

var _ ipam.Tx = (*tx)(nil)

func newTx(s *Store, lk *locked) *tx {
	return &tx{s: s, lk: lk, dir: lk.dir, side: -1, owners: -1, spare: -1, recs: map[string]*record{}}
}

// close releases the descriptors the transaction opened (not lk's).
func (t *tx) close() {
	for _, fd := range []int{t.side, t.owners, t.spare} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// tmpName is this call's staging file's name in .podwire.
func (t *tx) tmpName() string {
	if t.tmp == "" {
		var b [8]byte
		_, _ = rand.Read(b[:]) // never fails on Linux (getrandom)
		t.tmp = stagingPrefix + hex.EncodeToString(b[:]) + stagingSuffix
	}
	return t.tmp
}

// readLease reads the lease file name: fs.ErrNotExist when there is none, errNotFile
// when something other than a regular file (a symlink...) stands in its place, which
// is never followed.
func (t *tx) readLease(name string) ([]byte, ident, error) {
	// A lease is a container ID and an interface name; 4 KiB is plenty.
	b, st, err := readAt(t.dir, name, 4096)
	switch {
	case err == nil:
		return b, identOf(st), nil
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, errNotFile):
		return nil, ident{}, err
	}
	return nil, ident{}, ioError("reading lease "+name, err)
}

// verified returns the leases of r whose files still name r's owner, and drops the
// others from the index (released or re-leased behind podwire's back). An entry whose
// file was replaced by something else (a symlink: whose it is cannot be read without
// following it) is kept and reported Unreadable: the index is the only evidence left
// of whose the address is, so DEL removes the thing, a repeated ADD writes the lease
// again (Renew) and GC keeps it while the attachment is valid.
func (t *tx) verified(r *record) ([]ipam.Lease, error) {
	if r == nil {
		return nil, nil
	}
	var out []ipam.Lease
	kept := r.Leases[:0:0]
	for _, rl := range r.Leases {
		b, id, err := t.readLease(rl.IP)
		switch {
		case errors.Is(err, errNotFile):
			kept = append(kept, rl)
			out = append(out, ipam.Lease{IP: leaseIP(rl.IP), Owner: r.owner(), Unreadable: true})
			continue
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return nil, err
		}
		if o, ok := parseLease(b); !ok || o != r.owner() {
			continue
		}
		kept = append(kept, rl)
		out = append(out, ipam.Lease{IP: leaseIP(rl.IP), Owner: r.owner(), PrevBoot: t.prevBoot(rl, id)})
	}
	if len(kept) != len(r.Leases) {
		nr := *r
		nr.Leases = kept
		// Only a cache repair: a failure (read-only disk during CHECK) changes nothing.
		_ = t.saveRecord(&nr)
	}
	return out, nil
}

// prevBoot: the entry was made in another boot, for this very file.
func (t *tx) prevBoot(rl recLease, id ident) bool {
	return t.s.boot != "" && rl.Boot != "" && rl.Boot != t.s.boot && rl.Ino == id.ino && rl.MtimeNs == id.mtime
}

func (t *tx) Leases(o ipam.Owner) ([]ipam.Lease, error) {
	r, err := t.record(o)
	if err != nil {
		return nil, err
	}
	ls, err := t.verified(r)
	if err != nil || len(ls) > 0 || o.IfName == "" {
		return ls, err
	}
	if r, err = t.record(ipam.Owner{ContainerID: o.ContainerID}); err != nil {
		return nil, err
	}
	return t.verified(r)
}

// Renew marks o's index entries as made in this boot, and writes o's lease again
// where something other than a lease file (a symlink) was put in its place, so that
// the reference, which follows symlinks, reads o's lease there again too.
func (t *tx) Renew(o ipam.Owner) error {
	r, err := t.record(o)
	if r == nil || err != nil {
		return err
	}
	nr := *r
	nr.Leases = append([]recLease(nil), r.Leases...)
	changed := false
	for i := range nr.Leases {
		rl := &nr.Leases[i]
		var st unix.Stat_t
		if err := unix.Fstatat(t.dir, rl.IP, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
			id, placed, err := t.rewrite(o, rl.IP)
			if err != nil {
				return err
			}
			if placed {
				rl.Ino, rl.MtimeNs, rl.Boot, changed = id.ino, id.mtime, t.s.boot, true
			}
		}
		if rl.Boot != t.s.boot {
			rl.Boot, changed = t.s.boot, true
		}
	}
	if !changed {
		return nil
	}
	return t.saveRecord(&nr)
}

func (t *tx) Holder(ip net.IP) (ipam.Lease, bool, error) {
	name := ip.String()
	b, id, err := t.readLease(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return ipam.Lease{}, false, nil
	case errors.Is(err, errNotFile):
		return ipam.Lease{IP: leaseIP(name), Unreadable: true}, true, nil
	case err != nil:
		return ipam.Lease{}, false, err
	}
	l, err := t.lease(name, b, id)
	return l, err == nil, err
}

func (t *tx) lease(name string, content []byte, id ident) (ipam.Lease, error) {
	l := ipam.Lease{IP: leaseIP(name)}
	o, ok := parseLease(content)
	if !ok {
		l.Broken = t.stale(id.mtime)
		return l, nil
	}
	l.Owner = o
	r, err := t.record(o)
	if err != nil {
		return l, err
	}
	if r != nil {
		if i := r.find(name); i >= 0 {
			l.PrevBoot = t.prevBoot(r.Leases[i], id)
		}
	}
	return l, nil
}

func (t *tx) stale(mtimeNs int64) bool {
	return t.s.now().Sub(time.Unix(0, mtimeNs)) > t.s.grace
}

func (t *tx) LastReserved(set int) (net.IP, error) {
	b, _, err := readAt(t.dir, lastIPPrefix+strconv.Itoa(set), 64)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errNotFile) {
		return nil, nil // a symlink there is never read (ADD replaces it)
	}
	if err != nil {
		return nil, ioError("reading the last reserved address", err)
	}
	// Garbage (e.g. truncated by a crash) only costs round-robin its place.
	return leaseIP(string(b)), nil
}

// All lists every lease file of the network directory. A name holding something
// other than a regular file (a symlink...) is listed Unreadable; a directory is not
// listed (it is not a lease file, and not podwire's to remove).
func (t *tx) All() ([]ipam.Lease, error) {
	names, err := listAt(t.dir)
	if err != nil {
		return nil, ioError("listing the lease directory "+t.s.dir, err)
	}
	var out []ipam.Lease
	for _, name := range names {
		ip := leaseIP(name)
		if ip == nil {
			continue
		}
		b, id, err := t.readLease(name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case errors.Is(err, errNotFile):
			var st unix.Stat_t
			if unix.Fstatat(t.dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				out = append(out, ipam.Lease{IP: ip, Unreadable: true})
			}
			continue
		case err != nil:
			return nil, err
		}
		l, err := t.lease(name, b, id)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// Writable writes, fsyncs and removes a probe file next to the index.
func (t *tx) Writable() error {
	f, _, err := createAt(t.side, probeName, unix.O_WRONLY|unix.O_TRUNC)
	if err != nil {
		return fmt.Errorf("creating a file in %s: %w", t.s.side, err)
	}
	_, werr := f.Write(make([]byte, 512))
	if werr == nil {
		werr = f.Sync()
	}
	f.Close()
	_ = unix.Unlinkat(t.side, probeName, 0)
	if werr != nil {
		return fmt.Errorf("writing a file in %s: %w", t.s.side, werr)
	}
	return nil
}
