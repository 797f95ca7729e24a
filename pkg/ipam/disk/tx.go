package disk

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/ipam"
)

// tx is one locked operation on the store.
type tx struct {
	s          *Store
	recs       map[string]*record // index entries read or written so far; nil = none
	last       map[string]string  // last_reserved_ip.<set> contents
	stateDirty bool               // the index was rebuilt
	rebuilt    bool               // ... in this transaction
	changedDir bool               // a lease or last_reserved_ip file was created or removed

	spares []string // names in .podwire/spare; nil until listed

	lk *locked // the directory and lock file, locked by Do

	// tmp is this call's staging file, .podwire/lease.<random>.tmp ("" until first
	// needed). It is private to the call: concurrent calls (ours, or an older podwire
	// whose lock file was removed) never write into each other's.
	tmp      string
	tmpReady bool // tmp holds tmpOwner's lease, written, not yet placed
	tmpOwner ipam.Owner
	tmpID    ident
}

// tmpPath is this call's staging file.
func (t *tx) tmpPath() string {
	if t.tmp == "" {
		var b [8]byte
		_, _ = rand.Read(b[:]) // never fails on Linux (getrandom)
		t.tmp = stagingPrefix + hex.EncodeToString(b[:]) + stagingSuffix
	}
	return filepath.Join(t.s.side, t.tmp)
}

var _ ipam.Tx = (*tx)(nil)

func (t *tx) leasePath(name string) string { return filepath.Join(t.s.dir, name) }

// readLease reads the lease file name, refusing to follow a symlink planted in its
// place.
func (t *tx) readLease(name string) ([]byte, ident, error) {
	fd, err := unix.Open(t.leasePath(name), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, ident{}, fs.ErrNotExist
		}
		return nil, ident{}, ioError("reading lease "+name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, ident{}, ioError("reading lease "+name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, ident{}, ioError("reading lease "+name, fmt.Errorf("not a regular file"))
	}
	// A lease is a container ID and an interface name; bound the read so a huge
	// planted file cannot exhaust memory.
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return nil, ident{}, ioError("reading lease "+name, err)
	}
	return b, identOf(&st), nil
}

// verified returns the leases of r whose files still name r's owner, and drops the
// others from the index (released or re-leased behind podwire's back).
func (t *tx) verified(r *record) ([]ipam.Lease, error) {
	if r == nil {
		return nil, nil
	}
	var out []ipam.Lease
	kept := r.Leases[:0:0]
	for _, rl := range r.Leases {
		b, id, err := t.readLease(rl.IP)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		if o, ok := parseLease(b); err != nil || !ok || o != r.owner() {
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

func (t *tx) Renew(o ipam.Owner) error {
	r, err := t.record(o)
	if r == nil || err != nil {
		return err
	}
	nr := *r
	nr.Leases = append([]recLease(nil), r.Leases...)
	changed := false
	for i := range nr.Leases {
		if nr.Leases[i].Boot != t.s.boot {
			nr.Leases[i].Boot = t.s.boot
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return t.saveRecord(&nr)
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

// Adopt rewrites the lease file on ip from from's to to's: to's content is prepared
// in the staging file and renamed over the old one, so the address is never free.
// to's index entry is written before and from's is dropped after, so a crash leaves
// at worst an entry naming a file that is not its owner's, which verification drops.
func (t *tx) Adopt(ip net.IP, from, to ipam.Owner) error {
	name := ip.String()
	b, _, err := t.readLease(name)
	if errors.Is(err, fs.ErrNotExist) {
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
	if err := unix.Rename(t.tmpPath(), t.leasePath(name)); err != nil {
		undo()
		return ioError("rewriting lease "+name+" for "+to.String(), err)
	}
	t.tmpReady = false
	t.changedDir = true
	return t.indexDrop(from, name)
}

func (t *tx) Holder(ip net.IP) (ipam.Lease, bool, error) {
	name := ip.String()
	b, id, err := t.readLease(name)
	if errors.Is(err, fs.ErrNotExist) {
		return ipam.Lease{}, false, nil
	}
	if err != nil {
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

// Reserve places a lease on ip for o. The lease is first written completely to
// this call's staging file in .podwire, then renamed to its name with RENAME_NOREPLACE (link(2) where
// that is missing), which fails if the name exists: a crash of the process at any
// point leaves no lease or a complete one, never an empty file. The lease is not
// fsync'ed, as the reference's are not: only a power cut or kernel crash can lose its
// content, and then every pod died with the node, so no lease from before it is
// needed; an empty lease file it may leave is a broken lease, which allocation removes
// when it reaches it (after BrokenGrace) and GC removes too. The index entry is
// written before the lease is placed, so after a crash it may name a lease that does
// not exist (verification drops it), never miss one that does.
func (t *tx) Reserve(o ipam.Owner, ip net.IP, set int) (bool, error) {
	name := ip.String()
	path := t.leasePath(name)
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
	if err := renameNoReplace(t.tmpPath(), path); err != nil {
		undoRecord()
		if errors.Is(err, unix.EEXIST) {
			return false, nil // someone who does not take the lock got there first
		}
		return false, ioError("placing lease "+name+" in "+t.s.dir, err)
	}
	t.tmpReady = false
	t.changedDir = true

	setKey := strconv.Itoa(set)
	if err := t.writeLast(setKey, name); err != nil {
		_ = unix.Unlink(path)
		undoRecord()
		return false, err
	}
	return true, nil
}

// probe reports whether name is free, removing a broken lease file in its way.
func (t *tx) probe(name string) (bool, error) {
	var st unix.Stat_t
	err := unix.Lstat(t.leasePath(name), &st)
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
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	if _, ok := parseLease(b); ok || !t.stale(id.mtime) {
		return false, nil
	}
	if err := t.recycle(t.leasePath(name)); err != nil && !errors.Is(err, unix.ENOENT) {
		return false, ioError("removing broken (empty) lease "+name, err)
	}
	t.changedDir = true
	return true, nil
}

// prepareTmp writes o's lease content to the call's staging file (a spare inode if
// there is one), unless it is already there. On failure (disk full,
// read-only) nothing is left behind.
func (t *tx) prepareTmp(o ipam.Owner) error {
	if t.tmpReady && t.tmpOwner == o {
		return nil
	}
	t.abort()
	path := t.tmpPath()
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if t.takeSpare(path) {
		flags = os.O_WRONLY | unix.O_NOFOLLOW
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		_ = unix.Unlink(path)
		return ioError("writing a lease in "+t.s.dir, err)
	}
	fail := func(err error) error {
		f.Close()
		_ = unix.Unlink(path)
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
		_ = unix.Unlink(path)
		return ioError("writing a lease in "+t.s.dir, err)
	}
	t.tmpReady, t.tmpOwner, t.tmpID = true, o, identOf(&st)
	return nil
}

// writeLast rewrites last_reserved_ip.<set> in place, as the reference does (a crash
// in between leaves a wrong start for round-robin at worst; the reference's own
// truncate-then-write leaves an empty file).
func (t *tx) writeLast(set, ip string) error {
	path := t.leasePath(lastIPPrefix + set)
	if _, ok := t.last[set]; !ok {
		t.changedDir = true // created, most likely
	}
	if err := writeInPlace(path, []byte(ip)); err != nil {
		return ioError("recording the last reserved address in "+path, err)
	}
	if t.last == nil {
		t.last = map[string]string{}
	}
	t.last[set] = ip
	return nil
}

func (t *tx) LastReserved(set int) (net.IP, error) {
	b, err := os.ReadFile(t.leasePath(lastIPPrefix + strconv.Itoa(set)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, ioError("reading the last reserved address", err)
	}
	// Garbage (e.g. truncated by a crash) only costs round-robin its place.
	return leaseIP(string(b)), nil
}

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
		if err := t.recycle(t.leasePath(name)); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, ioError("removing lease "+name, err))
			continue
		}
		t.changedDir = true
		nr.drop(name)
	}
	if err := t.saveRecord(&nr); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (t *tx) ReleaseIP(ip net.IP, o ipam.Owner) error {
	name := ip.String()
	b, id, err := t.readLease(name)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err == nil {
		got, ok := parseLease(b)
		switch {
		case o == (ipam.Owner{}) && (ok || !t.stale(id.mtime)):
			return nil // not broken (any more)
		case o != (ipam.Owner{}) && got != o:
			return nil // someone else's now
		}
		if err := t.recycle(t.leasePath(name)); err != nil && !errors.Is(err, unix.ENOENT) {
			return ioError("removing lease "+name, err)
		}
		t.changedDir = true
	}
	if o == (ipam.Owner{}) {
		return nil
	}
	return t.indexDrop(o, name)
}

func (t *tx) All() ([]ipam.Lease, error) {
	entries, err := os.ReadDir(t.s.dir)
	if err != nil {
		return nil, ioError("listing the lease directory "+t.s.dir, err)
	}
	var out []ipam.Lease
	for _, e := range entries {
		if leaseIP(e.Name()) == nil || !e.Type().IsRegular() {
			continue
		}
		b, id, err := t.readLease(e.Name())
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		l, err := t.lease(e.Name(), b, id)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// Writable writes, fsyncs and removes a probe file next to the index.
func (t *tx) Writable() error {
	path := filepath.Join(t.s.side, probeName)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("creating a file in %s: %w", t.s.side, err)
	}
	_, werr := f.Write(make([]byte, 512))
	if werr == nil {
		werr = f.Sync()
	}
	f.Close()
	_ = unix.Unlink(path)
	if werr != nil {
		return fmt.Errorf("writing a file in %s: %w", t.s.side, werr)
	}
	return nil
}
