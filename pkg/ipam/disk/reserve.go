// SPDX-License-Identifier: Apache-2.0

package disk

import (
	"errors"
	"io/fs"
	"net"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/ipam"
)

// Reserve places a lease on ip for o. The lease is first written completely to this
// call's staging file in .podwire, then renamed to its name with RENAME_NOREPLACE
// (link(2) where that is missing), which fails if the name exists: a crash of the
// process at any point leaves no lease or a complete one, never an empty file, and
// two calls can never place a lease on the same address. The lease is not fsync'ed,
// as the reference's are not: only a power cut or kernel crash can lose its content,
// and then every pod died with the node, so no lease from before it is needed; an
// empty lease file it may leave is a broken lease, which allocation removes when it
// reaches it (after BrokenGrace) and GC removes too. The index entry is written
// before the lease is placed, so after a crash it may name a lease that does not
// exist (verification drops it), never miss one that does.
func (t *tx) Reserve(o ipam.Owner, ip net.IP, set int) (bool, error) {
	name := ip.String()
	if free, err := t.probe(name); err != nil || !free {
		return false, err
	}
	if err := t.prepareTmp(o); err != nil {
		return false, err
	}
	undoRecord, err := t.indexAdd(o, name, t.tmpID)
	if err != nil {
		return false, err
	}
	if err := renameNoReplace(t.side, t.tmp, t.dir, name); err != nil {
		undoRecord()
		if errors.Is(err, unix.EEXIST) {
			return false, nil // someone who does not take the lock got there first
		}
		return false, ioError("placing lease "+name+" in "+t.s.dir, err)
	}
	t.tmpReady = false
	t.changedDir = true

	if err := t.writeLast(strconv.Itoa(set), name); err != nil {
		_ = unix.Unlinkat(t.dir, name, 0)
		undoRecord()
		return false, err
	}
	return true, nil
}

// probe reports whether name is free, removing a broken lease file in its way.
// Anything but a regular file there (a symlink, a directory) is taken: whose it is
// cannot be told without following it.
func (t *tx) probe(name string) (bool, error) {
	var st unix.Stat_t
	err := unix.Fstatat(t.dir, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return true, nil
	}
	if err != nil {
		return false, ioError("checking lease "+name, err)
	}
	// Only a file too short to hold "<id>\r\n<ifname>" can be an empty or
	// whitespace-only one; skipping the read for the others keeps a walk over taken
	// addresses at one lstat per address.
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size >= 4 {
		return false, nil
	}
	b, id, err := t.readLease(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return true, nil
	case errors.Is(err, errNotFile):
		return false, nil
	case err != nil:
		return false, err
	}
	if _, ok := parseLease(b); ok || !t.stale(id.mtime) {
		return false, nil
	}
	if err := t.recycle(t.dir, name); err != nil && !errors.Is(err, unix.ENOENT) {
		return false, ioError("removing broken (empty) lease "+name, err)
	}
	t.changedDir = true
	return true, nil
}

// prepareTmp writes o's lease content to the call's staging file (a spare inode if
// there is one), unless it is already there. On failure (disk full, read-only)
// nothing is left behind.
func (t *tx) prepareTmp(o ipam.Owner) error {
	if t.tmpReady && t.tmpOwner == o {
		return nil
	}
	t.abort()
	name := t.tmpName()
	t.takeSpare(t.side, name)
	f, _, err := createAt(t.side, name, unix.O_WRONLY)
	if err != nil {
		_ = unix.Unlinkat(t.side, name, 0)
		return ioError("writing a lease in "+t.s.dir, err)
	}
	fail := func(err error) error {
		f.Close()
		_ = unix.Unlinkat(t.side, name, 0)
		return ioError("writing a lease in "+t.s.dir, err)
	}
	content := leaseContent(o)
	if _, err := f.WriteAt([]byte(content), 0); err != nil {
		return fail(err)
	}
	if err := f.Truncate(int64(len(content))); err != nil {
		return fail(err)
	}
	if err := f.Chmod(0o600); err != nil {
		return fail(err)
	}
	// No fsync (it cost 1-3 ms per ADD on a disk-backed dataDir): see Reserve.
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		_ = unix.Unlinkat(t.side, name, 0)
		return ioError("writing a lease in "+t.s.dir, err)
	}
	t.tmpReady, t.tmpOwner, t.tmpID = true, o, identOf(&st)
	return nil
}

// rewrite puts o's lease on name, where something other than a regular file (a
// symlink) stands in its place: that is removed (the link, never its target) and the
// lease placed with no-replace semantics. It reports whether it placed the lease: a
// directory there is left alone, and a lease file that is back is left to
// verification.
func (t *tx) rewrite(o ipam.Owner, name string) (ident, bool, error) {
	if err := t.prepareTmp(o); err != nil {
		return ident{}, false, err
	}
	if err := removeNonFile(t.dir, name); err != nil && !errors.Is(err, unix.ENOENT) {
		if errors.Is(err, unix.EISDIR) {
			return ident{}, false, nil
		}
		return ident{}, false, ioError("removing what replaced lease "+name, err)
	}
	t.changedDir = true
	if err := renameNoReplace(t.side, t.tmp, t.dir, name); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return ident{}, false, nil
		}
		return ident{}, false, ioError("writing lease "+name+" again in "+t.s.dir, err)
	}
	t.tmpReady = false
	return t.tmpID, true, nil
}

// writeLast rewrites last_reserved_ip.<set> in place, as the reference does (a crash
// in between leaves a wrong start for round-robin at worst; the reference's own
// truncate-then-write leaves an empty file). A symlink in its place is replaced.
func (t *tx) writeLast(set, ip string) error {
	if _, ok := t.last[set]; !ok {
		t.changedDir = true // created, most likely
	}
	if err := writeAt(t.dir, lastIPPrefix+set, []byte(ip)); err != nil {
		path := filepath.Join(t.s.dir, lastIPPrefix+set)
		return ioError("recording the last reserved address in "+path, inTheWay(err, path))
	}
	if t.last == nil {
		t.last = map[string]string{}
	}
	t.last[set] = ip
	return nil
}

// Adopt rewrites the lease file on ip from from's to to's: to's content is prepared
// in the staging file and renamed over the old one, so the address is never free.
// to's index entry is written before and from's is dropped after, so a crash leaves
// at worst an entry naming a file that is not its owner's, which verification drops.
func (t *tx) Adopt(ip net.IP, from, to ipam.Owner) error {
	name := ip.String()
	b, _, err := t.readLease(name)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errNotFile) {
		return nil
	}
	if err != nil {
		return err
	}
	if o, ok := parseLease(b); !ok || o != from {
		return nil
	}
	if err := t.prepareTmp(to); err != nil {
		return err
	}
	undo, err := t.indexAdd(to, name, t.tmpID)
	if err != nil {
		return err
	}
	if err := unix.Renameat(t.side, t.tmp, t.dir, name); err != nil {
		undo()
		return ioError("rewriting lease "+name+" for "+to.String(), err)
	}
	t.tmpReady = false
	t.changedDir = true
	return t.indexDrop(from, name)
}

// indexAdd records the lease file name (identity id) in o's index entry, and returns
// how to take that back.
func (t *tx) indexAdd(o ipam.Owner, name string, id ident) (undo func(), err error) {
	r, err := t.record(o)
	if err != nil {
		return nil, err
	}
	nr := record{ContainerID: o.ContainerID, IfName: o.IfName}
	if r != nil {
		nr.Leases = append(nr.Leases, r.Leases...)
	}
	nr.drop(name)
	nr.Leases = append(nr.Leases, recLease{IP: name, Ino: id.ino, MtimeNs: id.mtime, Boot: t.s.boot})
	if err := t.saveRecord(&nr); err != nil {
		return nil, err
	}
	return func() {
		if r != nil {
			_ = t.saveRecord(r)
		} else {
			_ = t.saveRecord(&record{ContainerID: o.ContainerID, IfName: o.IfName})
		}
	}, nil
}

// indexDrop removes the lease file name from o's index entry.
func (t *tx) indexDrop(o ipam.Owner, name string) error {
	r, err := t.record(o)
	if err != nil || r == nil || r.find(name) < 0 {
		return err
	}
	nr := *r
	nr.Leases = append([]recLease(nil), r.Leases...)
	nr.drop(name)
	return t.saveRecord(&nr)
}
