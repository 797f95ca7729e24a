// SPDX-License-Identifier: Apache-2.0

package disk

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/ipam"
)

const (
	stateName  = "state"
	ownersName = "owners"
	// A call's staging file is stagingPrefix + random + stagingSuffix ("lease.tmp",
	// which older podwire versions used, matches too).
	stagingPrefix = "lease."
	stagingSuffix = ".tmp"
	probeName     = "probe.tmp"
)

// state is what the index knew about the lease directory at its last commit. When
// the directory no longer matches it, something other than podwire (the reference
// host-local, a person) changed the leases and the index is rebuilt.
type state struct {
	Version  int               `json:"version"`
	Boot     string            `json:"boot"`
	DirMtime int64             `json:"dirMtimeNs"`
	Last     map[string]string `json:"lastReserved"` // "<set>" -> last_reserved_ip.<set> content
}

// record is one attachment's entry in the index: owners/<hash>.
type record struct {
	ContainerID string     `json:"containerID"`
	IfName      string     `json:"ifName"`
	Leases      []recLease `json:"leases"`
}

type recLease struct {
	IP string `json:"ip"`
	// Ino and MtimeNs identify the lease file this entry was made for. A lease file
	// re-created by someone else has another identity, so a boot recorded for the old
	// file never applies to the new one.
	Ino     uint64 `json:"ino"`
	MtimeNs int64  `json:"mtimeNs"`
	// Boot is the boot ID during which podwire wrote or first saw the lease file.
	Boot string `json:"boot"`
}

type ident struct {
	ino   uint64
	mtime int64
}

func identOf(st *unix.Stat_t) ident {
	return ident{ino: st.Ino, mtime: st.Mtim.Nano()}
}

func (r *record) owner() ipam.Owner { return ipam.Owner{ContainerID: r.ContainerID, IfName: r.IfName} }

func (r *record) find(ip string) int {
	for i := range r.Leases {
		if r.Leases[i].IP == ip {
			return i
		}
	}
	return -1
}

func (r *record) drop(ip string) bool {
	if i := r.find(ip); i >= 0 {
		r.Leases = append(r.Leases[:i], r.Leases[i+1:]...)
		return true
	}
	return false
}

// ownerKey names an attachment's index file. The IDs are hashed because a container
// ID may be long and the index must not depend on what characters runtimes use.
func ownerKey(o ipam.Owner) string {
	sum := sha256.Sum256([]byte(o.ContainerID + "\x00" + o.IfName))
	return hex.EncodeToString(sum[:20])
}

// leaseContent is exactly what the reference writes into a lease file.
func leaseContent(o ipam.Owner) string {
	return strings.TrimSpace(o.ContainerID) + lineBreak + o.IfName
}

// parseLease reads a lease file's content as the reference does (surrounding
// whitespace ignored). A file without a line break is a legacy lease (container ID
// only); an empty one has no owner.
func parseLease(b []byte) (ipam.Owner, bool) {
	s := strings.TrimSpace(string(b))
	if s == "" {
		return ipam.Owner{}, false
	}
	id, ifname, ok := strings.Cut(s, lineBreak)
	if !ok {
		return ipam.Owner{ContainerID: s}, true
	}
	return ipam.Owner{ContainerID: id, IfName: ifname}, true
}

// leaseIP returns the address a directory entry is a lease for, or nil when the name
// is not one the reference would write (lock, last_reserved_ip.*, .podwire, ...).
func leaseIP(name string) net.IP {
	ip := net.ParseIP(name)
	if ip == nil || ip.String() != name {
		return nil
	}
	if v4 := ip.To4(); v4 != nil {
		return v4
	}
	return ip
}

// begin brings the index up to date. It is rebuilt from the lease files when there is
// no index yet or the node has rebooted since the last commit (a power cut may have
// lost index writes). When the lease directory changed behind podwire's back in this
// boot — its mtime differs (a lease file was created or removed) or a last_reserved_ip
// file differs (the reference rewrites one on every reservation, which catches even a
// change within the same mtime tick) — catchUp reads what changed.
func (t *tx) begin() error {
	s := t.s
	var err error
	if t.side, _, err = openDirAt(t.dir, sideDirName); err != nil {
		return ioError("opening the lease index "+s.side, err)
	}
	// An owners directory that had to be made (removed, or a symlink in its place)
	// lost every entry: rebuild.
	var madeOwners bool
	if t.owners, madeOwners, err = openDirAt(t.side, ownersName); err != nil {
		return ioError("opening the lease index "+filepath.Join(s.side, ownersName), err)
	}
	// No state (or a symlink in its place, never read): rebuild.
	b, _, err := readAt(t.side, stateName, 1<<20)
	if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, errNotFile) {
		return ioError("reading the lease index", err)
	}
	if err := t.removeStaleStaging(); err != nil {
		return err
	}
	var st state
	valid := err == nil && !madeOwners && json.Unmarshal(b, &st) == nil && st.Version == 1 && st.Boot == s.boot
	fresh := valid
	if fresh {
		mt, err := t.dirMtime()
		if err != nil {
			return err
		}
		fresh = mt == st.DirMtime
	}
	if fresh {
		for set, want := range st.Last {
			got, _, err := readAt(t.dir, lastIPPrefix+set, 64)
			if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, errNotFile) {
				return ioError("reading "+lastIPPrefix+set, err)
			}
			if err != nil || string(got) != want {
				fresh = false
				break
			}
		}
	}
	if fresh {
		t.last = st.Last
		return nil
	}
	if valid {
		return t.catchUp(st.DirMtime)
	}
	return t.rebuild()
}

// catchUpSlack is how far before the last commit catchUp still reads lease files:
// the kernel stamps files with a coarse clock, and a slack covers small steps of it.
const catchUpSlack = 2 * time.Second

// catchUp brings the index up to date after a change behind podwire's back in this
// boot, reading only the lease files created or changed since podwire's last commit.
//
// The index may name a lease that is gone or now someone else's (reads verify every
// entry against its file and drop such ones), but it must not miss a lease that
// exists, or DEL would not find it. A lease file made or changed since the last
// commit has a ctime at or after that commit's directory mtime (the kernel sets ctime
// on create, write and rename, and nothing can set it back), so one stat per lease
// file finds them; only those are read, and added to their owners' entries. Entries
// naming removed files stay until they are next read (or the next full rebuild). If
// the clock went back since the last commit, it rebuilds instead.
func (t *tx) catchUp(lastCommit int64) error {
	s := t.s
	now := time.Now().UnixNano()
	if lastCommit > now+int64(time.Second) {
		return t.rebuild()
	}
	names, err := listAt(t.dir)
	if err != nil {
		return ioError("listing the lease directory "+s.dir, err)
	}
	since := lastCommit - int64(catchUpSlack)
	t.last = map[string]string{}
	for _, name := range names {
		if set, ok := strings.CutPrefix(name, lastIPPrefix); ok {
			if b, _, err := readAt(t.dir, name, 64); err == nil {
				t.last[set] = string(b)
			}
			continue
		}
		if leaseIP(name) == nil {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(t.dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return ioError("reading lease "+name, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		ctime := st.Ctim.Nano()
		if ctime > now+int64(time.Second) {
			return t.rebuild() // the clock went back: ctimes say nothing
		}
		if ctime < since {
			continue
		}
		b, id, err := t.readLease(name)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errNotFile) {
			continue
		}
		if err != nil {
			return err
		}
		o, ok := parseLease(b)
		if !ok {
			continue // empty: broken, not in the index
		}
		r, err := t.record(o)
		if err != nil {
			return err
		}
		if t.rebuilt {
			return nil // a torn entry made record rebuild everything
		}
		if r != nil {
			if i := r.find(name); i >= 0 && r.Leases[i].Ino == id.ino && r.Leases[i].MtimeNs == id.mtime {
				continue
			}
		}
		nr := record{ContainerID: o.ContainerID, IfName: o.IfName}
		if r != nil {
			nr.Leases = append(nr.Leases, r.Leases...)
		}
		nr.drop(name)
		nr.Leases = append(nr.Leases, recLease{IP: name, Ino: id.ino, MtimeNs: id.mtime, Boot: s.boot})
		if err := t.saveRecord(&nr); err != nil {
			return err
		}
	}
	t.stateDirty = true
	return nil
}

func (t *tx) dirMtime() (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(t.dir, &st); err != nil {
		return 0, ioError("reading the lease directory "+t.s.dir, err)
	}
	return st.Mtim.Nano(), nil
}

// rebuild makes the index match the lease files: one full read of the directory.
// Entries that still describe the same lease file keep their boot ID; leases podwire
// had not seen get the current boot (they cannot be proven older).
func (t *tx) rebuild() error {
	s := t.s
	names, err := listAt(t.dir)
	if err != nil {
		return ioError("listing the lease directory "+s.dir, err)
	}
	scanned := map[string]*record{}
	t.recs = map[string]*record{}
	t.last = map[string]string{}
	for _, name := range names {
		if set, ok := strings.CutPrefix(name, lastIPPrefix); ok {
			if b, _, err := readAt(t.dir, name, 64); err == nil {
				t.last[set] = string(b)
			}
			continue
		}
		if leaseIP(name) == nil {
			continue
		}
		b, id, err := t.readLease(name)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errNotFile) {
				continue // an unreadable one (a symlink) is not followed
			}
			return err
		}
		o, ok := parseLease(b)
		if !ok {
			continue // empty: broken, not in the index
		}
		k := ownerKey(o)
		r := scanned[k]
		if r == nil {
			r = &record{ContainerID: o.ContainerID, IfName: o.IfName}
			scanned[k] = r
		}
		r.Leases = append(r.Leases, recLease{IP: name, Ino: id.ino, MtimeNs: id.mtime, Boot: s.boot})
	}

	existing, err := listAt(t.owners)
	if err != nil {
		return ioError("listing the lease index", err)
	}
	for _, k := range existing {
		if strings.HasPrefix(k, ".") {
			_ = unix.Unlinkat(t.owners, k, 0) // a crashed index write
			continue
		}
		old, _ := t.readRecord(k)
		r := scanned[k]
		if r == nil {
			if err := unix.Unlinkat(t.owners, k, 0); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EISDIR) {
				return ioError("removing a stale index entry", err)
			}
			continue
		}
		delete(scanned, k)
		if old != nil && old.owner() == r.owner() {
			for i := range r.Leases {
				if j := old.find(r.Leases[i].IP); j >= 0 && old.Leases[j].Ino == r.Leases[i].Ino && old.Leases[j].MtimeNs == r.Leases[i].MtimeNs {
					r.Leases[i].Boot = old.Leases[j].Boot
				}
			}
			if recordsEqual(old, r) {
				t.recs[k] = old
				continue
			}
		}
		if err := t.writeRecord(k, r); err != nil {
			return err
		}
	}
	for k, r := range scanned {
		if err := t.writeRecord(k, r); err != nil {
			return err
		}
	}
	t.stateDirty = true
	t.rebuilt = true
	return nil
}

func recordsEqual(a, b *record) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// commit removes the temporary lease and, when the lease directory changed, records
// its new state. If anything here fails the state stays old, so the next call
// rebuilds the index instead of trusting it.
func (t *tx) commit() error {
	t.abort()
	if !t.stateDirty && !t.changedDir {
		return nil
	}
	mt, err := t.dirMtime()
	if err != nil {
		return err
	}
	b, _ := json.Marshal(state{Version: 1, Boot: t.s.boot, DirMtime: mt, Last: t.last})
	return t.writeFile(t.side, t.s.side, stateName, b, "saving the lease index state")
}

// abort puts an unplaced temporary lease back among the spares.
func (t *tx) abort() {
	if t.tmpReady {
		_ = t.recycle(t.side, t.tmp)
		t.tmpReady = false
	}
}

// staleStagingAge is how old another call's staging file must be before a call that
// does not hold the directory lock (see locked.exclusive) removes it; a live call
// places its lease within milliseconds.
const staleStagingAge = time.Minute

// removeStaleStaging removes staging files left by crashed calls: they are no lease.
// Holding the directory lock, every one is stale; without it, only old ones are.
func (t *tx) removeStaleStaging() error {
	names, err := listAt(t.side)
	if err != nil {
		return ioError("listing the lease index "+t.s.side, err)
	}
	for _, name := range names {
		if !strings.HasPrefix(name, stagingPrefix) || !strings.HasSuffix(name, stagingSuffix) {
			continue
		}
		if !t.lk.exclusive {
			var st unix.Stat_t
			// ctime, not mtime: a spare renamed into place keeps its old mtime.
			if unix.Fstatat(t.side, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || time.Since(time.Unix(0, st.Ctim.Nano())) < staleStagingAge {
				continue
			}
		}
		// Best effort: a leftover that cannot be removed (read-only disk, a directory
		// planted under that name) is no lease either.
		_ = unix.Unlinkat(t.side, name, 0)
	}
	return nil
}

// record returns o's index entry, read once per transaction; nil when it has none.
// An entry that exists but does not parse was torn by a crash mid-write: the whole
// index is rebuilt from the lease files before answering.
func (t *tx) record(o ipam.Owner) (*record, error) {
	k := ownerKey(o)
	r, ok := t.recs[k]
	if !ok {
		var corrupt bool
		r, corrupt = t.readRecord(k)
		if corrupt && !t.rebuilt {
			if err := t.rebuild(); err != nil {
				return nil, err
			}
			return t.record(o)
		}
		if r != nil && r.owner() != o {
			r = nil // a hash collision: treat as absent
		}
		t.recs[k] = r
	}
	return r, nil
}

// readRecord reads owners/<k>: nil when there is none; corrupt when it exists but
// does not parse.
func (t *tx) readRecord(k string) (r *record, corrupt bool) {
	// A symlink in place of an entry is never read: corrupt, so the index is rebuilt
	// (which replaces or removes it).
	b, _, err := readAt(t.owners, k, 1<<20)
	if err != nil {
		return nil, !errors.Is(err, fs.ErrNotExist)
	}
	r = &record{}
	if json.Unmarshal(b, r) != nil {
		return nil, true
	}
	return r, false
}

// saveRecord writes r (or removes its file when it has no lease left).
func (t *tx) saveRecord(r *record) error {
	k := ownerKey(r.owner())
	if len(r.Leases) == 0 {
		if old, known := t.recs[k]; known && old == nil {
			return nil // there is no file
		}
		t.recs[k] = nil
		if err := t.recycle(t.owners, k); err != nil && !errors.Is(err, unix.ENOENT) {
			return ioError("removing the index entry of "+r.owner().String(), err)
		}
		return nil
	}
	return t.writeRecord(k, r)
}

func (t *tx) writeRecord(k string, r *record) error {
	if old, known := t.recs[k]; known && old == nil {
		// A new entry: reuse a spare inode rather than allocate one.
		t.takeSpare(t.owners, k)
	}
	t.recs[k] = r
	b, _ := json.Marshal(r)
	return t.writeFile(t.owners, filepath.Join(t.s.side, ownersName), k, b, "saving the index entry of "+r.owner().String())
}

// writeFile rewrites the index file name in dir (at dirPath) in place (see writeAt).
// Index files need neither a temporary file nor fsync: a crash that tears one leaves a
// file that does not parse, which makes the next call rebuild the index from the lease
// files (as does the new boot ID after a power cut).
func (t *tx) writeFile(dir int, dirPath, name string, data []byte, what string) error {
	if err := writeAt(dir, name, data); err != nil {
		return ioError(what, inTheWay(err, filepath.Join(dirPath, name)))
	}
	return nil
}

// inTheWay adds the fix to the error of writing a file where a directory stands
// (podwire never removes a directory it did not make).
func inTheWay(err error, path string) error {
	if errors.Is(err, unix.EISDIR) {
		return fmt.Errorf("%w: %s is a directory; remove it, and podwire writes its file there", err, path)
	}
	return err
}
