// SPDX-License-Identifier: Apache-2.0

package disk

import (
	"errors"
	"io/fs"
	"net"

	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/ipam"
)

// Release removes every lease Leases(o) returns. A lease file replaced by a symlink
// (or another non-file) is removed too: the link itself, never its target; a
// directory in its place is left (it is not podwire's to delete) and only dropped
// from the index, so that DEL succeeds.
func (t *tx) Release(o ipam.Owner) error {
	ls, err := t.Leases(o)
	if err != nil || len(ls) == 0 {
		return err
	}
	owner := ls[0].Owner // o, or its legacy form
	var errs []error
	r, err := t.record(owner)
	if err != nil || r == nil {
		return err
	}
	nr := *r
	nr.Leases = append([]recLease(nil), r.Leases...)
	for _, l := range ls {
		name := l.IP.String()
		if err := t.remove(name, l.Unreadable); err != nil {
			errs = append(errs, ioError("removing lease "+name, err))
			continue
		}
		nr.drop(name)
	}
	if err := t.saveRecord(&nr); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// remove takes the lease file name out of the lease directory: a regular file goes to
// the spare pool, anything else but a directory is unlinked. Gone already is success.
func (t *tx) remove(name string, unreadable bool) error {
	var err error
	if unreadable {
		err = removeNonFile(t.dir, name)
		if errors.Is(err, unix.EISDIR) {
			return nil
		}
	} else {
		err = t.recycle(t.dir, name)
	}
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err == nil {
		t.changedDir = true
	}
	return err
}

// ReleaseIP removes the lease on ip if o still holds it. For the zero Owner it
// removes a broken lease (empty and stale) or an unreadable one (a symlink...: GC and
// reclaim pass those); for another owner, an unreadable file in place of the lease
// is removed when o's index entry names it (see verified).
func (t *tx) ReleaseIP(ip net.IP, o ipam.Owner) error {
	name := ip.String()
	b, id, err := t.readLease(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case errors.Is(err, errNotFile):
		if o != (ipam.Owner{}) {
			r, err := t.record(o)
			if err != nil {
				return err
			}
			if r == nil || r.find(name) < 0 {
				return nil // nothing says it is o's
			}
		}
		if err := t.remove(name, true); err != nil {
			return ioError("removing "+name+", which is not a lease file", err)
		}
	case err != nil:
		return err
	default:
		got, ok := parseLease(b)
		switch {
		case o == (ipam.Owner{}) && (ok || !t.stale(id.mtime)):
			return nil // not broken (any more)
		case o != (ipam.Owner{}) && got != o:
			return nil // someone else's now
		}
		if err := t.remove(name, false); err != nil {
			return ioError("removing lease "+name, err)
		}
	}
	if o == (ipam.Owner{}) {
		return nil
	}
	return t.indexDrop(o, name)
}
